"""A pool of HTTP replicas shared by the remote engines (upstream, orpheus):
routing and ejection (pure), the pooled client, health probes and metrics."""
