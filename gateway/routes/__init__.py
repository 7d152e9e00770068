"""HTTP and WebSocket routes: thin layers over the session and the engine."""
