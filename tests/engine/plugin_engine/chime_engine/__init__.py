"""``chime``: an example third-party engine for voice-gateway (a chime per
segment), registered through the ``voice_gateway.engines`` entry point."""
