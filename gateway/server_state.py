"""What the app shares between requests, created in the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.engines.base import Engine
from gateway.metrics import Metrics
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.session import Session

log = logging.getLogger(__name__)


class StreamAdmission:
    """At most ``limit`` utterances stream at once across the server; beyond
    that a new utterance is refused with ``busy`` rather than slowing
    everyone (the limit is set from measured capacity)."""

    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit = limit
        self.active = 0
        self._metrics = metrics

    def try_acquire(self) -> bool:
        if self.active >= self.limit:
            return False
        self.active += 1
        self._metrics.streams_active.set(self.active)
        return True

    def release(self, count: int = 1) -> None:
        self.active = max(0, self.active - count)
        self._metrics.streams_active.set(self.active)


class RateLimiter:
    """A token bucket: ``rate`` events per ``per`` seconds, bursts of ``rate``."""

    def __init__(self, rate: float, per: float) -> None:
        self.capacity = rate
        self.refill = rate / per
        self.tokens = rate
        self.stamp = time.monotonic()

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.refill)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass(eq=False)
class GatewayState:
    settings: Settings
    engine: Engine
    metrics: Metrics
    ready: bool = False
    shutting_down: bool = False
    sessions: int = 0
    live_sessions: set[Session] = field(default_factory=set)
    sessions_by_client: dict[str, int] = field(default_factory=dict)
    connection_rates: dict[str, RateLimiter] = field(default_factory=dict)
    admission: StreamAdmission = field(init=False)

    def __post_init__(self) -> None:
        self.admission = StreamAdmission(self.settings.max_active_streams, self.metrics)

    async def drain(self) -> None:
        """Graceful shutdown: refuse new sessions (``/readyz`` 503, 1013),
        cancel and report utterances without ``input.done``, let the others
        finish for up to ``drain_timeout_s``, then close every session with
        1001 (reporting what was still in progress)."""
        from gateway.errors import CloseCode
        from gateway.outbound import ConnectionGone

        self.shutting_down = True
        sessions = list(self.live_sessions)
        log.info("draining %d sessions (up to %g s)", len(sessions), self.settings.drain_timeout_s)
        for session in sessions:
            with contextlib.suppress(ConnectionGone):
                await session.begin_drain()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.drain_timeout_s):
                # many sessions' streams, no single event to wait on: poll
                while any(s.busy() for s in self.live_sessions):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
        await asyncio.gather(
            *(s.close(CloseCode.GOING_AWAY, "server shutdown") for s in list(self.live_sessions)),
            return_exceptions=True,
        )
        log.info("drained")

    def connection_allowed(self, client: str) -> bool:
        """Connections per minute per client address."""
        if len(self.connection_rates) > 10_000:  # bound the table
            self.connection_rates.clear()
        limiter = self.connection_rates.get(client)
        if limiter is None:
            limiter = RateLimiter(self.settings.max_connections_per_minute, 60.0)
            self.connection_rates[client] = limiter
        return limiter.allow()
