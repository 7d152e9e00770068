"""One WebSocket session: the core state machine (no I/O), its contexts and
utterances, the cancel report, config validation and the audio stream that
speaks a context's segments."""
