"""The Orpheus TTS engine's parts (in progress): prompt layout and token-to-SNAC
code mapping (pure); the streaming SNAC decoder is ``gateway.vocoders.snac_stream``.
The vLLM client and the engine itself are not built yet (see docs/engine.md)."""
