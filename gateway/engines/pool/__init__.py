"""A pool of HTTP replicas shared by the remote engines (upstream, orpheus):
routing and ejection (pure), the pooled client, the one failover loop, the
remote-engine shell, health probes and metrics."""
