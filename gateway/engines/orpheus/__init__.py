"""The Orpheus TTS engine (``engine = "orpheus"``): prompts (``prompt``),
vLLM's streamed completions (``completions``, ``client``), token-to-SNAC
code mapping (``tokens``, ``codes``), the batched decode worker (``decoder``)
and the engine (``engine``); the streaming SNAC decoder is
``gateway.vocoders.snac_stream``.  See docs/engine.md."""
