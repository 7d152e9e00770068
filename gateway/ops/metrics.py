"""Prometheus metrics, one registry per app (so tests can run several apps).

Labels are bounded: error codes from the registry, never session ids.  Names
and meanings are listed in ``docs/operations.md``; a test checks the list.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from gateway.flow.capacity import DoorController

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: admission queue waits: from immediate grants to past a 5 s deadline
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
Surface = Literal["ws", "http"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge(
            "gateway_sessions_active", "Open WebSocket sessions.", registry=r
        )
        self.streams_active = Gauge(
            "gateway_streams_active", "Utterances currently being synthesized or sent.", registry=r
        )
        self.http_streams_active = Gauge(
            "gateway_http_streams_active", "HTTP speech responses in progress.", registry=r
        )
        self.utterances = Counter("gateway_utterances", "Utterances started.", registry=r)
        self.sentences = Counter("gateway_sentences", "Segments synthesized.", registry=r)
        self.time_to_first_audio = Histogram(
            "gateway_time_to_first_audio_seconds",
            "Server-side time from an utterance's first speakable segment to its first byte.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.acoustic_seconds = Histogram(
            "gateway_acoustic_seconds",
            "Engine acoustic-model time per segment.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_chunk_seconds = Histogram(
            "gateway_first_chunk_seconds",
            "Engine time from submit to a segment's first decoded chunk.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.engine_queue_depth = Gauge(
            "gateway_engine_queue_depth", "Work items waiting for an engine worker.", registry=r
        )
        self.engine_work_item_max = Gauge(
            "gateway_engine_work_item_max",
            "The largest engine work item run since start, in the engine's unit"
            " (session.created.limits.work_item_unit; Piper: phonemes per acoustic call).",
            registry=r,
        )
        self.engine_live_jobs = Gauge(
            "gateway_engine_live_jobs", "Engine jobs not yet finished (debug).", registry=r
        )
        self.live_tasks = Gauge(
            "gateway_live_tasks", "Asyncio tasks alive in the server's loop (debug).", registry=r
        )
        self.loop_lag = Histogram(
            "gateway_event_loop_lag_seconds",
            "How late the event loop ran a 100 ms timer.",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.underruns = Counter(
            "gateway_underruns",
            "Times a client's reported position caught up with all audio sent mid-utterance.",
            registry=r,
        )
        self.cancels = Counter("gateway_cancels", "Utterances cancelled.", registry=r)
        self.frames_sent = Counter(
            "gateway_frames_sent", "Binary WebSocket messages sent.", registry=r
        )
        self.bytes_sent = Counter(
            "gateway_bytes_sent", "Binary payload bytes sent (WebSocket and HTTP).", registry=r
        )
        self.errors = Counter(
            "gateway_errors", "Errors reported to clients, by registry code.", ["code"], registry=r
        )

        # resume (gateway.session.resume_book): suspended sessions and resumes
        self.sessions_suspended = Gauge(
            "gateway_sessions_suspended",
            "WebSocket sessions whose connection dropped, waiting for session.resume"
            " (counted in gateway_sessions_active too).",
            registry=r,
        )
        self.suspended_bytes = Gauge(
            "gateway_suspended_replay_bytes",
            "Replay bytes (audio and event characters) held by suspended sessions.",
            registry=r,
        )
        self.suspended_evicted = Counter(
            "gateway_suspended_evicted",
            "Suspended sessions ended before their window to make room, by the limit.",
            ["limit"],
            registry=r,
        )
        self.resumes_accepted = Counter(
            "gateway_resumes_accepted",
            "session.resume attempts that took a session back.",
            registry=r,
        )
        self.resumes_refused = Counter(
            "gateway_resumes_refused",
            "session.resume attempts refused, by reason (the error code).",
            ["reason"],
            registry=r,
        )

        # admission (gateway.flow.admission), per surface: the autoscaling signals
        self.admission_queue_depth = Gauge(
            "gateway_admission_queue_depth",
            "Requests waiting for a slot, by surface (ws: sessions at the door, http: responses).",
            ["surface"],
            registry=r,
        )
        self.admission_slots_in_use = Gauge(
            "gateway_admission_slots_in_use", "Slots held, by surface.", ["surface"], registry=r
        )
        self.admission_slots_limit = Gauge(
            "gateway_admission_slots_limit",
            "Slots available (max_active_streams, max_http_streams), by surface.",
            ["surface"],
            registry=r,
        )
        self.admission_wait = Histogram(
            "gateway_admission_wait_seconds",
            "Time a granted request waited for its slot (0 when one was free), by surface.",
            ["surface"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.admission_refused = Counter(
            "gateway_admission_refused",
            "Requests refused a slot, by surface and reason (full, deadline, draining);"
            " ws: sessions refused at the door.",
            ["surface", "reason"],
            registry=r,
        )

        # the door of automatic admission (gateway.flow.capacity)
        self.engine_realtime_streams = Gauge(
            "gateway_engine_realtime_streams",
            "The start probe: real-time streams the engine produced at once when the"
            " gateway started (NaN: not measured, a fixed max_active_streams).",
            registry=r,
        )
        self.engine_realtime_streams.set(math.nan)
        self.door_capacity = Gauge(
            "gateway_door_capacity_streams",
            "Real-time streams automatic admission reserves compute for: the reserved"
            " cores over the cost, less any cut on late work.",
            registry=r,
        )
        self.door_cost = Gauge(
            "gateway_door_cost_seconds",
            "CPU seconds a second of speech costs, as measured under load (NaN: not yet).",
            registry=r,
        )
        self.door_budget = Gauge(
            "gateway_door_budget_cores",
            "The cores automatic admission reserves for speaking streams.",
            registry=r,
        )
        self.door_speaking = Gauge(
            "gateway_door_speaking_sessions", "Admitted sessions speaking now.", registry=r
        )
        self.door_share = Gauge(
            "gateway_door_speaking_share",
            "The average share of the time an admitted session speaks.",
            registry=r,
        )
        self.door_slack = Gauge(
            "gateway_door_slack_p10_seconds",
            "The load signal: 10th percentile of how long before its audio is due the"
            " engine's recent work finished (NaN: too few items).",
            registry=r,
        )
        self.door_overcommit = Gauge(
            "gateway_door_overcommit",
            "Sessions the door admits over the capacity in streams.",
            registry=r,
        )

    def admission(self, surface: Surface) -> SurfaceAdmission:
        """The admission metrics of one surface (``gateway.flow.admission.AdmissionMetrics``)."""
        active = self.streams_active if surface == "ws" else self.http_streams_active
        return SurfaceAdmission(self, surface, active)

    def report_door(self, door: DoorController, speaking: int) -> None:
        """One reading of automatic admission's door (``gateway.flow.capacity.follow``)."""
        self.door_capacity.set(door.capacity)
        self.door_cost.set(math.nan if door.cost is None else door.cost)
        self.door_budget.set(door.budget_cores)
        self.door_speaking.set(speaking)
        self.door_share.set(door.share)
        self.door_slack.set(math.nan if door.slack_p10 is None else door.slack_p10)
        self.door_overcommit.set(door.overcommit)

    def track_engine(
        self,
        queue_depth: Callable[[], int],
        live_jobs: Callable[[], int],
        largest_work_item: Callable[[], int] = lambda: 0,
    ) -> None:
        self.engine_queue_depth.set_function(queue_depth)
        self.engine_live_jobs.set_function(live_jobs)
        self.engine_work_item_max.set_function(largest_work_item)

    def track_suspended(self, sessions: Callable[[], int], replay_bytes: Callable[[], int]) -> None:
        """The suspended sessions' figures, read at each scrape (``ResumeBook``)."""
        self.sessions_suspended.set_function(sessions)
        self.suspended_bytes.set_function(replay_bytes)

    def render(self) -> bytes:
        self.live_tasks.set(len(asyncio.all_tasks()))
        return generate_latest(self.registry)


class SurfaceAdmission:
    """One surface's admission metrics, as ``AdmissionGate`` reports them."""

    def __init__(self, metrics: Metrics, surface: Surface, active: Gauge) -> None:
        self._active = active  # the older per-surface gauge, kept for dashboards
        self._in_use = metrics.admission_slots_in_use.labels(surface=surface)
        self._limit = metrics.admission_slots_limit.labels(surface=surface)
        self._depth = metrics.admission_queue_depth.labels(surface=surface)
        self._wait = metrics.admission_wait.labels(surface=surface)
        self._refused = metrics.admission_refused
        self._surface = surface

    def update(self, *, active: int, limit: int, depth: int) -> None:
        self._active.set(active)
        self._in_use.set(active)
        self._limit.set(limit)
        self._depth.set(depth)

    def waited(self, seconds: float) -> None:
        self._wait.observe(seconds)

    def refused(self, refusal: str) -> None:
        self._refused.labels(surface=self._surface, reason=refusal).inc()


async def watch_loop_lag(metrics: Metrics, interval: float = 0.1) -> None:
    """Sample event-loop lag until cancelled."""
    while True:
        before = time.monotonic()
        await asyncio.sleep(interval)
        metrics.loop_lag.observe(max(0.0, time.monotonic() - before - interval))
