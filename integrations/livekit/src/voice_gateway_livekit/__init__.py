"""LiveKit Agents TTS plugin for the voice gateway's streaming WebSocket."""

from voice_gateway_livekit.tts import TTS, ChunkedStream, SynthesizeStream

__all__ = ["TTS", "ChunkedStream", "SynthesizeStream"]
