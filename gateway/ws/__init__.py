"""The WebSocket surface ``/v1/audio/speech/stream``: the endpoint and its
connection, the serialized outbound sender and ping handling."""
