"""Automatic admission: how many conversations the door lets in.

What this module is for: with ``max_active_streams = 0`` (the default), the
number of WebSocket sessions admitted at once (``gateway.flow.admission``;
a session is admitted once, at its first committed text, and keeps its
admission until it ends) follows what conversations cost on this machine,
for an engine whose compute is the gateway's own (one that reports
``Engine.take_lateness``: Piper).  It is a reservation of measured compute:

* **Cost**: the CPU seconds a second of audio takes, measured while the
  gateway runs: each engine stage's items that ran on one thread (their
  ``time.thread_time``; ``gateway.engines.deadline_worker`` says why only
  those) over the audio they made or covered, plus the event loop's CPU
  time over the audio the engine made.  Each is averaged over about
  ``cost_average_audio_s`` seconds of audio, from samples of at least
  ``cost_sample_audio_s``.
* **Capacity**, in real-time streams: the **budget** (``budget_cores``:
  ``CPU_SHARE`` of the cores the process may run on) over the cost, so the
  streams that may speak at once use at most that share of the machine.
  Until every part of the cost has been measured (the first seconds under
  load), capacity is ``SEED_SHARE`` of the engine's real-time streams
  measured at start (``gateway.engines.throughput``).
* **Speaking share**: the part of the time an admitted session speaks
  (committed text being synthesized or sent), averaged over the admitted
  sessions and over about ``share_average_s``.  A voice agent waiting for
  its user speaks little; an LLM reading a long answer speaks all the time.

The door admits ``capacity / share`` sessions, at most ``max_overcommit``
times capacity.  So if every admitted session spoke at once, their measured
cost would reach at most ``max_overcommit`` x ``CPU_SHARE`` of the cores
(1.2 x 0.55: 0.66); the engine then shares it earliest deadline first, and
the door stays closed until the load drops; no admitted session is refused
or cut.  Why 1.2: a session's share is an average over the sessions
admitted and the last half minute, and new sessions come in bursts that
all speak at once (users finishing their turns together, a gateway taking
over another's traffic).  With 1.5, an overload of 40 new sessions after a
quieter minute (share about 0.5) was let in at 13-14 sessions on a
capacity of 9-10 streams, and their conversations had gaps (round 13); an
LLM-paced conversation speaks about 0.9 of the time, so 1.2 still admits
capacity / share of them, and a smaller overcommit would leave the
machine idle while agents listen.

**Why a reservation and not a load signal.**  Rounds 7-12
(docs/benchmarks.md) sized the door from the *slack* of the engine's work
(how long before its audio is due each item finished): it stays above
90 ms until the engine is overloaded, then collapses within a second, so a
controller that rises on it finds the cliff only by stepping over it, and
since admission is kept for a session's life, each step over costs the
admitted conversations their gaps until one ends.  The cost is smooth in the
load (an audio second costs about the same with 4 or 12 streams speaking
once the cores are contended) and known before the cliff, as Envoy's
adaptive concurrency and Netflix's Vegas limiter size from a measured
minimum rather than from the absence of errors.  The slack stays as a safety
cut: below ``tight_s`` at the 10th percentile of the last ``window`` items
(so one late item among many moves nothing), capacity is cut to
``cut_factor`` of the streams speaking, but to no less than ``cut_keeps``
of itself (at most every ``hold_s``, and the window starts again: a load
that stays too much is cut again); above ``ample_s`` it comes back by
``trim_step`` of the reservation at most every ``rise_every_s``, never past
it.

The controller is pure (the caller passes ``now`` and the readings),
table-tested in ``tests/flow/test_capacity.py``; ``follow`` is the thin loop
that feeds it and applies its limit to the ``AdmissionGate``.  The start's
measurement and the engine's readings are the app's to wire
(``GatewayState.start_automatic_admission``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.flow.admission import AdmissionGate

log = logging.getLogger(__name__)

#: of the engine's measured real-time streams, the capacity the start assumes
#: (a conversation's audio costs about twice the probe's: short segments,
#: small first chunks, the event loop's framing and sends; round 12)
SEED_SHARE = 0.5
#: of the cores the process may run on, the share the measured cost of the
#: streams speaking may reach.  Calibrated on the ladder of conversations
#: that take turns with their listeners (docs/benchmarks.md, round 14): with
#: fixed doors the machine held 14-16 of them, the step past failing on one
#: underrun while sixteen started within a second, the process at 1.25 of 2
#: cores and the measured cost 0.08-0.10 CPU s per audio s.  0.55 (with the
#: 1.2 overcommit: a door of 1.32 cores over the cost, 13-17 sessions) holds
#: what the fixed doors held.  0.6 held it too, but in the overload (40 new
#: sessions that speak all the time) it admitted more of them at once than
#: the machine sustains, and they gapped: 26 gapped conversations in three
#: runs against 1 for 0.55, same sitting; in round 15, 6 and 2 of 14-15.
#: What makes 14 too many there is the overload's shape: its first 14 of 40
#: arrive within 0.6 s, and at a fixed door of 14 they gapped in most runs,
#: alone at that density too (more beside the 26 refused sessions'
#: connections), never when the same 14 started over 3 s (rounds 16-17).
#: Round 13's 0.5 was
#: calibrated on a ladder whose users asked for 1.6-2 streams each (the next
#: reply sent as soon as the last one's audio had arrived), and stopped
#: these conversations at 12
CPU_SHARE = 0.55
#: how often ``follow`` reads the engine
TICK_S = 0.25


@dataclass(frozen=True)
class StageCost:
    """One engine stage's items that ran on one thread over an interval:
    their CPU seconds and the seconds of audio they made or covered."""

    cpu_s: float = 0.0
    audio_s: float = 0.0

    def add(self, cpu_s: float, audio_s: float) -> StageCost:
        return StageCost(self.cpu_s + cpu_s, self.audio_s + audio_s)


@dataclass(frozen=True)
class Lateness:
    """An engine's work over an interval: items finished, how many of them
    finished late after waiting behind other work, the seconds its busiest
    worker spent running items, the slack of each item that finished
    (seconds between when it finished and when its audio is due; negative:
    late), not counting items that were late without waiting (their text
    came late: not load), each stage's cost, and the seconds of audio made."""

    finished: int = 0
    late: int = 0
    busy_s: float = 0.0
    slack_s: tuple[float, ...] = ()
    stages: tuple[StageCost, ...] = ()
    audio_s: float = 0.0


@dataclass(frozen=True)
class CapacityPolicy:
    #: the fewest sessions the door admits
    floor: int = 1
    #: the most sessions the door admits (the app passes ``max_sessions``)
    ceiling: int = 64
    #: the cores the process may run on (the app passes them)
    cores: int = 2
    #: of them, the share the measured cost of speaking streams may reach
    cpu_share: float = CPU_SHARE
    #: no cost sample from less audio than this
    cost_sample_audio_s: float = 1.0
    #: the cost is averaged over about this much audio
    cost_average_audio_s: float = 20.0
    #: 10th-percentile slack below this: more speaks than the machine serves
    tight_s: float = 0.04
    #: 10th-percentile slack above this: a cut may come back (Piper's work
    #: runs 0.12-0.17 s ahead of its listener at the 10th percentile with
    #: one conversation speaking: its decode is paced by the listener's buffer)
    ample_s: float = 0.09
    #: slack samples the percentile is read over
    window: int = 48
    #: no decision on fewer samples than this
    min_samples: int = 16
    #: a cut sets capacity to this share of the streams speaking
    cut_factor: float = 0.85
    #: but keeps at least this share of the capacity it cuts.  Without it a
    #: cut while few of the admitted sessions speak closed the door to one
    #: or two: with one session speaking, as the first of a run's eight
    #: started (7 -> 1, and twelve replies refused at the door; round 19),
    #: or at a start burst, three of eight speaking while the others' first
    #: items queued (9 -> 2; round 20, docs/benchmarks.md).  A cut comes
    #: back by ``trim_step`` a second, slower than the door's queue deadline.
    cut_keeps: float = 0.7
    #: no further cut for this long after one
    hold_s: float = 2.0
    #: after a cut, capacity comes back by this share of the reservation at
    #: most this often
    rise_every_s: float = 1.0
    trim_step: float = 0.1
    #: a new session's share before any is measured
    prior_share: float = 1.0
    #: no session counts for less than this share of a stream
    min_share: float = 0.25
    #: the share is averaged over about this long
    share_average_s: float = 30.0
    #: speaking streams are averaged over about this long (for a cut)
    speaking_average_s: float = 2.0
    #: the door admits at most this many times capacity
    max_overcommit: float = 1.2


def seed_capacity(realtime_streams: float, policy: CapacityPolicy) -> float:
    """The capacity to start from, given the engine's measured real-time streams."""
    return max(float(policy.floor), realtime_streams * SEED_SHARE)


class CostMeter:
    """CPU seconds per second of audio, per part (the engine's stages and
    the event loop), each an average over about ``average_audio_s`` of
    audio built from samples of at least ``sample_audio_s``.  Pure."""

    def __init__(self, sample_audio_s: float, average_audio_s: float) -> None:
        self._sample_audio_s = sample_audio_s
        self._average_audio_s = average_audio_s
        self._pending: dict[str, StageCost] = {}
        #: each part's average (seconds of CPU per second of audio)
        self.parts: dict[str, float] = {}

    def add(self, part: str, cpu_s: float, audio_s: float) -> None:
        pending = self._pending.get(part, StageCost()).add(cpu_s, audio_s)
        if pending.audio_s < self._sample_audio_s:
            self._pending[part] = pending
            return
        self._pending[part] = StageCost()
        sample = pending.cpu_s / pending.audio_s
        if part not in self.parts:
            self.parts[part] = sample
        else:
            weight = min(1.0, pending.audio_s / self._average_audio_s)
            self.parts[part] += weight * (sample - self.parts[part])

    def per_audio_s(self, parts: int) -> float | None:
        """The sum over ``parts`` parts, once every one has been measured."""
        if len(self.parts) < parts:
            return None
        return sum(self.parts.values())


def _percentile(values: deque[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class DoorController:
    """The automatic door.  Pure: every reading comes with ``now``."""

    def __init__(self, seed: float, policy: CapacityPolicy) -> None:
        self.policy = policy
        #: capacity until the cost is measured (``seed_capacity``)
        self.seed = seed
        self.meter = CostMeter(policy.cost_sample_audio_s, policy.cost_average_audio_s)
        #: CPU seconds per second of audio (None until every part is measured)
        self.cost: float | None = None
        #: the share of the reservation the slack's safety cut leaves (1: all)
        self.trim = 1.0
        #: real-time streams the door reserves compute for
        self.capacity = self._capacity()
        #: the average speaking share of an admitted session
        self.share = policy.prior_share
        #: streams speaking, averaged over ``speaking_average_s``
        self.speaking = 0.0
        #: the safety signal: 10th-percentile slack of the window (None: too few samples)
        self.slack_p10: float | None = None
        self._slack: deque[float] = deque(maxlen=policy.window)
        self._parts = 0
        self._cut_at = -math.inf
        self._rose_at = -math.inf
        self._read_at: float | None = None
        self.limit = self._limit()

    @property
    def overcommit(self) -> float:
        """Admitted sessions ÷ capacity: how many times what the machine
        serves they would ask if all spoke at once."""
        return self.limit / self.capacity

    @property
    def budget_cores(self) -> float:
        """The cores the door reserves for speaking streams."""
        return self.policy.cores * self.policy.cpu_share

    def reservation(self) -> float:
        """Streams the budget pays for at the measured cost (the seed until then)."""
        if self.cost is None:
            return self.seed
        return self.budget_cores / max(self.cost, 1e-6)

    def update(
        self,
        now: float,
        lateness: Lateness,
        admitted: int,
        speaking: int,
        waiting: int,
        loop_cpu_s: float = 0.0,
    ) -> int:
        """The limit after a reading: the engine's work since the last one,
        the sessions admitted, how many of them speak, how many wait at the
        door, and the event loop's CPU seconds since the last reading."""
        p = self.policy
        interval = 0.0 if self._read_at is None else max(0.0, now - self._read_at)
        self._read_at = now
        if admitted:
            weight = min(1.0, interval / p.share_average_s)
            self.share += weight * (min(1.0, speaking / admitted) - self.share)
        weight = min(1.0, interval / p.speaking_average_s) if interval else 1.0
        self.speaking += weight * (speaking - self.speaking)
        self._measure(lateness, loop_cpu_s)
        self._slack.extend(lateness.slack_s)
        self.slack_p10 = (
            _percentile(self._slack, 0.1) if len(self._slack) >= p.min_samples else None
        )
        if self.slack_p10 is not None:
            speaking_now = max(self.speaking, float(speaking))
            if self.slack_p10 < p.tight_s and now - self._cut_at >= p.hold_s and speaking_now >= 1:
                # (with nobody speaking, the late work was of sessions gone)
                capacity = self._capacity()
                cut = max(min(capacity, speaking_now) * p.cut_factor, capacity * p.cut_keeps)
                self.trim = min(1.0, cut / self.reservation())
                self._cut_at = now
                self._slack.clear()
                self.slack_p10 = None
            elif (
                self.slack_p10 > p.ample_s
                and self.trim < 1.0
                and now - self._rose_at >= p.rise_every_s
                and now - self._cut_at >= p.hold_s
            ):
                self.trim = min(1.0, self.trim + p.trim_step)
                self._rose_at = now
                self._slack.clear()  # the next step reads the load this one admits
                self.slack_p10 = None
        self.capacity = self._capacity()
        self.limit = self._limit()
        return self.limit

    def _measure(self, lateness: Lateness, loop_cpu_s: float) -> None:
        for index, stage in enumerate(lateness.stages):
            self.meter.add(f"stage {index}", stage.cpu_s, stage.audio_s)
        if lateness.audio_s > 0:  # (the loop's CPU while nothing speaks is not audio's)
            self.meter.add("event loop", loop_cpu_s, lateness.audio_s)
        self._parts = max(self._parts, len(lateness.stages) + 1)
        self.cost = self.meter.per_audio_s(self._parts)

    def _capacity(self) -> float:
        p = self.policy
        return min(float(p.ceiling), max(float(p.floor), self.trim * self.reservation()))

    def _limit(self) -> int:
        p = self.policy
        share = max(p.min_share, self.share)
        sessions = min(self.capacity / share, self.capacity * p.max_overcommit)
        return max(p.floor, min(p.ceiling, math.floor(sessions + 1e-9)))


async def follow(
    gate: AdmissionGate,
    read: Callable[[], Lateness | None],
    speaking: Callable[[], int],
    controller: DoorController,
    report: Callable[[DoorController, int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Apply the controller's limit to ``gate`` every ``TICK_S`` until cancelled
    (the app's lifespan runs it as a task).  ``speaking``: how many admitted
    sessions speak now; ``report``: called with each reading (metrics)."""
    gate.set_limit(controller.limit)
    loop_cpu = time.thread_time()  # this runs on the event loop's thread
    while True:
        await asyncio.sleep(TICK_S)
        lateness = read()
        if lateness is None:
            continue
        before, talking = controller.limit, speaking()
        cpu = time.thread_time()
        loop_cpu_s, loop_cpu = cpu - loop_cpu, cpu
        limit = controller.update(clock(), lateness, gate.active, talking, gate.depth, loop_cpu_s)
        if report is not None:
            report(controller, talking)
        if limit != before:
            log.info(
                "admission: door %d -> %d sessions (capacity %.1f streams, cost %s,"
                " trim %.2f, share %.2f, %d admitted, %d speaking, %d waiting,"
                " slack p10 %s;"
                " last %.2f s: %d of %d items late, busiest thread %.2f s)",
                before,
                limit,
                controller.capacity,
                "n/a" if controller.cost is None else f"{controller.cost:.3f} cpu s/audio s",
                controller.trim,
                controller.share,
                gate.active,
                talking,
                gate.depth,
                "n/a" if controller.slack_p10 is None else f"{controller.slack_p10 * 1000:.0f} ms",
                TICK_S,
                lateness.late,
                lateness.finished,
                lateness.busy_s,
            )
            gate.set_limit(limit)
