"""Per-replica Prometheus metrics of the upstream pool, read at scrape time.

A ``Collector`` over the pool's own counters (``pool.Replica``) and the
client's time-to-first-byte histograms: the pool stays free of Prometheus,
and the labels are the replicas' redacted URLs (no credentials, no query)
plus bounded failure kinds.  Names are listed in ``docs/operations.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from gateway.engines.pool.replicas import ReplicaClient
from gateway.engines.pool.routing import ReplicaState


class PoolCollector:
    def __init__(self, client: ReplicaClient) -> None:
        self.client = client

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only (no duplicate checks at register)

    def collect(self) -> Iterator[Any]:
        client = self.client
        pool = client.pool
        now = client.clock()
        requests = CounterMetricFamily(
            "gateway_upstream_requests", "Speech requests sent, per replica.", labels=["replica"]
        )
        failures = CounterMetricFamily(
            "gateway_upstream_failures",
            "Failed speech requests, per replica and kind.",
            labels=["replica", "kind"],
        )
        ejections = CounterMetricFamily(
            "gateway_upstream_ejections",
            "Times a replica was ejected after repeated failures.",
            labels=["replica"],
        )
        outstanding = GaugeMetricFamily(
            "gateway_upstream_outstanding",
            "Requests in flight per replica (prefetched ones included).",
            labels=["replica"],
        )
        state = GaugeMetricFamily(
            "gateway_upstream_replica_state",
            "1 for the replica's current state, 0 for the others.",
            labels=["replica", "state"],
        )
        ttfb = HistogramMetricFamily(
            "gateway_upstream_time_to_first_byte_seconds",
            "Time from sending a request to its first audio, per replica.",
            labels=["replica"],
        )
        for replica in pool.replicas:
            name = replica.name
            requests.add_metric([name], replica.requests)
            for kind, count in sorted(replica.failures.items()):
                failures.add_metric([name, kind], count)
            ejections.add_metric([name], replica.ejections)
            outstanding.add_metric([name], replica.outstanding)
            current = pool.state_of(replica.index, now)
            for s in ReplicaState:
                state.add_metric([name, s.value], 1.0 if s is current else 0.0)
            hist = client.ttfb[replica.index]
            buckets = [(str(b), float(c)) for b, c in zip(hist.buckets, hist.counts, strict=True)]
            buckets.append(("+Inf", float(hist.count)))
            ttfb.add_metric([name], buckets, hist.total)
        yield from (requests, failures, ejections, outstanding, state, ttfb)
