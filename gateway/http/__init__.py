"""The HTTP surface: OpenAI-compatible speech (``speech`` routes; ``plan``,
``synthesis``, ``sse``, ``response``) and batch, voices, the request guard
(Host, Origin, keys, per-client limits), error responses and guarded
response bodies."""
