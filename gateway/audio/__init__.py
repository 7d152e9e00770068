"""Audio output: everything between an engine's float32 samples and the wire.

One module per concept, shared by the WebSocket endpoint and the HTTP API:

* ``encoding``: float32 samples to ``pcm_s16le``, ``pcm_f32le``, G.711 mu-law
  and A-law bytes, and back;
* ``wav``: complete WAV files and streaming WAV headers;
* ``resample``: the streaming resampler from the voice's rate to the client's;
* ``framing``: the frame grid (``frame_ms``) and the tagged binary header.

Everything here is pure and synchronous (no asyncio, no I/O); the session
layer owns the order of calls.  See ``docs/audio.md``.
"""
