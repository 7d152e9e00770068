"""What the app shares between requests, created in the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gateway.engines.base import Engine
from gateway.engines.throughput import realtime_streams
from gateway.errors import CloseCode
from gateway.flow import capacity
from gateway.flow.admission import AdmissionGate, SlotQueue
from gateway.ops.metrics import Metrics
from gateway.session.resume_book import ResumeBook, SuspendLimits, default_gateway_id
from gateway.settings import Settings
from gateway.text.stage import Lexicon
from gateway.ws.outbound import ConnectionGone

log = logging.getLogger(__name__)

#: the door (sessions admitted) of ``max_active_streams = 0`` (automatic) for an engine
#: whose load the gateway cannot follow (``gateway.flow.capacity``), and until
#: the start's measurement
FIXED_ACTIVE_STREAMS = 20

#: how often a drain looks whether its sessions still have work (a
#: shutdown's ``GatewayState.drain``, a ``session.close`` in the endpoint's
#: reader): many streams, no single event to wait on
DRAIN_POLL_S = 0.05


class LiveSession(Protocol):
    """What a shutdown needs of an open WebSocket session
    (``gateway.ws.endpoint.Connection``)."""

    def busy(self) -> bool: ...

    async def begin_drain(self) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


@runtime_checkable
class Speaker(Protocol):
    """An admitted session, as the door's follower reads it (``Session``)."""

    def speaking(self) -> bool: ...


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
    live_sessions: set[LiveSession] = field(default_factory=set)
    sessions_by_client: dict[str, int] = field(default_factory=dict)
    connection_rates: dict[str, RateLimiter] = field(default_factory=dict)
    #: ``session.resume`` attempts per client (``max_resumes_per_minute``)
    resume_rates: dict[str, RateLimiter] = field(default_factory=dict)
    #: the server's pronunciation lexicon (``lexicon_file``), read at start
    lexicon: Lexicon = ()
    #: WebSocket sessions admitted at once (``max_active_streams``): the door
    admission: AdmissionGate = field(init=False)
    #: HTTP speech responses in progress (``max_http_streams``)
    http_admission: AdmissionGate = field(init=False)
    #: automatic admission's start: the engine's measured real-time streams
    measured_streams: float | None = None
    #: automatic admission's controller (None: a fixed door)
    door: capacity.DoorController | None = None
    #: the HTTP API's text front-end: one thread of its own, so a request's
    #: whole input (up to ``max_utterance_chars``, about 0.3 s of CPU for the
    #: worst text measured) never holds the default executor's threads that
    #: the WebSocket sessions' long segments are read in (``http/synthesis``)
    http_text_reader: ThreadPoolExecutor = field(init=False)
    #: the sessions' resume tokens and the suspended sessions' windows
    resumes: ResumeBook = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.resumes = ResumeBook(
            s.resume_window_s,
            gateway_id=s.gateway_id or default_gateway_id(),
            limits=SuspendLimits(
                s.max_suspended_sessions,
                s.max_suspended_sessions_per_client,
                s.max_suspended_bytes,
            ),
            report_s=s.resume_report_s,
        )
        resumes = self.resumes
        if s.resume_window_s > 0:
            log.info("gateway id %r: the prefix of its resume tokens", resumes.gateway_id)
        resumes.on_evicted = lambda limit: self.metrics.suspended_evicted.labels(limit).inc()
        self.metrics.track_suspended(lambda: resumes.suspended, lambda: resumes.retained_bytes)
        self.http_text_reader = ThreadPoolExecutor(1, thread_name_prefix="http-text")
        self.admission = AdmissionGate(
            SlotQueue(
                s.max_active_streams or FIXED_ACTIVE_STREAMS,
                s.admission_queue_length,
                s.admission_deadline_s,
            ),
            self.metrics.admission("ws"),
        )
        self.http_admission = AdmissionGate(
            SlotQueue(s.max_http_streams, s.admission_queue_length, s.admission_deadline_s),
            self.metrics.admission("http"),
        )

    def speaking_sessions(self) -> int:
        """Admitted WebSocket sessions that speak now (``Session.speaking``)."""
        return sum(
            1
            for holder in self.admission.queue.holders()
            if isinstance(holder, Speaker) and holder.speaking()
        )

    def door_full(self) -> bool:
        """The door is closed: a new conversation would wait (or be refused)."""
        gate = self.admission
        return gate.active >= gate.limit or gate.depth > 0

    async def start_automatic_admission(self) -> asyncio.Task[None] | None:
        """Measure the engine and follow its load with the door
        (``max_active_streams = 0``, ``gateway.flow.capacity``).  None for an
        engine that reports no lateness: the door then admits its declared
        ``max_concurrency`` sessions, or ``FIXED_ACTIVE_STREAMS``."""
        engine, gate = self.engine, self.admission
        if engine.take_lateness() is None:
            if engine.capabilities.max_concurrency:
                gate.set_limit(engine.capabilities.max_concurrency)
            return None
        policy = capacity.CapacityPolicy(
            ceiling=self.settings.max_sessions,
            cores=len(os.sched_getaffinity(0)),
        )
        self.measured_streams = await realtime_streams(engine)
        engine.take_lateness()  # the probe's own work is not load
        controller = self.door = capacity.DoorController(
            capacity.seed_capacity(self.measured_streams, policy), policy
        )
        self.metrics.engine_realtime_streams.set(self.measured_streams)
        self.metrics.report_door(controller, 0)
        log.info(
            "automatic admission: %.1f real-time streams measured, capacity %.1f streams,"
            " the door admits %d sessions to start (up to %d); %.2f cores reserved",
            self.measured_streams,
            controller.capacity,
            controller.limit,
            policy.ceiling,
            controller.budget_cores,
        )

        return asyncio.create_task(
            capacity.follow(
                gate,
                engine.take_lateness,
                self.speaking_sessions,
                controller,
                self.metrics.report_door,
            ),
            name="admission-capacity",
        )

    async def drain(self) -> None:
        """Graceful shutdown: refuse new sessions (``/readyz`` 503, 1013),
        cancel and report utterances without ``input.done``, let the others
        finish for up to ``drain_timeout_s``, then close every session with
        1001 (reporting what was still in progress)."""
        self.shutting_down = True
        await self.resumes.end_all()  # a drain never waits for a resume
        self.admission.begin_drain()
        self.http_admission.begin_drain()
        sessions = list(self.live_sessions)
        log.info("draining %d sessions (up to %g s)", len(sessions), self.settings.drain_timeout_s)
        for session in sessions:
            with contextlib.suppress(ConnectionGone):
                await session.begin_drain()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.drain_timeout_s):
                while any(s.busy() for s in self.live_sessions):  # noqa: ASYNC110
                    await asyncio.sleep(DRAIN_POLL_S)
        await asyncio.gather(
            *(s.close(CloseCode.GOING_AWAY, "server shutdown") for s in list(self.live_sessions)),
            return_exceptions=True,
        )
        log.info("drained")

    def connection_allowed(self, client: str) -> bool:
        """Connections per minute per client (address or agent key)."""
        return _allowed(self.connection_rates, client, self.settings.max_connections_per_minute)

    def resume_allowed(self, client: str) -> bool:
        """``session.resume`` attempts per minute per client, failed ones
        included (a client guessing tokens is refused)."""
        return _allowed(self.resume_rates, client, self.settings.max_resumes_per_minute)


def _allowed(rates: dict[str, RateLimiter], client: str, per_minute: int) -> bool:
    if len(rates) > 10_000:  # bound the table
        rates.clear()
    limiter = rates.get(client)
    if limiter is None:
        limiter = RateLimiter(per_minute, 60.0)
        rates[client] = limiter
    return limiter.allow()
