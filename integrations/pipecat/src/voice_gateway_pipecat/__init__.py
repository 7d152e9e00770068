"""Pipecat TTS service for the voice gateway's streaming WebSocket."""

from voice_gateway_pipecat.tts import GatewayTTSService, GatewayTTSSettings

__all__ = ["GatewayTTSService", "GatewayTTSSettings"]
