"""The HTTP surface: OpenAI-compatible speech and batch, voices, the request
guard (Host, Origin, keys, per-client limits), error responses and guarded
response bodies."""
