"""Automatic admission: how many conversations the door lets in.

What this module is for: with ``max_active_streams = 0`` (the default), the
number of WebSocket sessions admitted at once (``gateway.flow.admission``;
a session is admitted once, at its first committed text, and keeps its
admission until it ends) follows what conversations cost on this machine,
for an engine whose compute is the gateway's own (one that reports
``Engine.take_lateness``: Piper).  It is sized in two quantities:

* **Capacity**, in real-time streams: how many utterances can speak at once
  without their audio running late.  It starts from ``SEED_SHARE`` of the
  engine's real-time streams measured at start (``gateway.engines.throughput``)
  and then follows a continuous load signal, the **slack** of the engine's
  work: how long before its audio is due each work item finished
  (``WorkItem.due``: when the listener plays it).  Over a sliding window of
  the last ``window`` items, the 10th percentile is the signal (so one late
  item among many moves nothing).  Below ``tight_s``, the streams speaking
  are more than the machine serves: capacity is cut to ``cut_factor`` of
  what was speaking (never more often than ``hold_s``, and the window
  starts again, so each decision reads fresh evidence).  Above ``ample_s``
  with sessions waiting at the door *and the capacity in use* (at least
  ``floor(capacity)`` streams speaking), capacity rises by ``rise_step`` at
  most every ``rise_every_s``, and the window starts again too.  Only
  evidence read while the capacity was used may grow it, as TCP grows a
  congestion window only while the window is used (RFC 7661): admission is
  kept for a session's life, so a rise on the slack of sessions that had
  not started speaking yet admits a conversation the machine cannot carry,
  and every admitted one has gaps until one ends (round 12: at the
  ladder's x8 step the door rose from 6 to 7 while 4 of its 6 sessions
  spoke; in the overload scenario it reached 8, and all 8 admitted
  conversations had gaps).  Between the two it holds (the
  hysteresis band), like
  the gradient and Vegas limiters of Netflix's concurrency-limits: a
  smoothed signal against two thresholds, a multiplicative cut, an additive
  rise.
* **Speaking share**: the part of the time an admitted session speaks
  (committed text being synthesized or sent), averaged over the admitted
  sessions and over about ``share_average_s``.  A voice agent waiting for its
  user speaks little; an LLM reading a long answer speaks all the time.

The door admits ``capacity / share`` sessions, at most ``max_overcommit``
times capacity: so idle agents count for little, and if every admitted
session spoke at once the machine would be asked at most ``max_overcommit``
times what it serves.  It then shares by earliest deadline first (the
engine's workers) and the door stays closed until the load drops; no
admitted session is refused or cut.  Why 1.5: a session's share is an
average, and LLM-paced conversations speak in bursts that line up (several
users finish their turns together); a larger overcommit turns those
coincidences into playback gaps for everyone, a smaller one leaves the
machine idle while agents listen.

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
SEED_SHARE = 0.5
#: how often ``follow`` reads the engine
TICK_S = 0.25


@dataclass(frozen=True)
class Lateness:
    """An engine's work over an interval: items finished, how many of them
    finished late after waiting behind other work, the seconds its busiest
    worker spent running items, and the slack of each item that finished
    (seconds between when it finished and when its audio is due; negative:
    late), not counting items that were late without waiting (their text
    came late: not load)."""

    finished: int = 0
    late: int = 0
    busy_s: float = 0.0
    slack_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class CapacityPolicy:
    #: the fewest sessions the door admits
    floor: int = 1
    #: the most sessions the door admits (the app passes ``max_sessions``)
    ceiling: int = 64
    #: 10th-percentile slack below this: more speaks than the machine serves
    tight_s: float = 0.04
    #: 10th-percentile slack above this: room for more (Piper's work runs
    #: 0.12-0.17 s ahead of its listener at the 10th percentile with one
    #: conversation speaking: its decode is paced by the listener's buffer)
    ample_s: float = 0.09
    #: slack samples the percentile is read over
    window: int = 48
    #: no decision on fewer samples than this
    min_samples: int = 16
    #: a cut sets capacity to this share of the streams speaking
    cut_factor: float = 0.85
    #: no further cut for this long after one
    hold_s: float = 2.0
    #: a rise (of ``rise_step`` streams) at most this often
    rise_every_s: float = 1.0
    rise_step: float = 0.5
    #: a new session's share before any is measured
    prior_share: float = 1.0
    #: no session counts for less than this share of a stream
    min_share: float = 0.25
    #: the share is averaged over about this long
    share_average_s: float = 30.0
    #: speaking streams are averaged over about this long (for a cut)
    speaking_average_s: float = 2.0
    #: the door admits at most this many times capacity
    max_overcommit: float = 1.5


def seed_capacity(realtime_streams: float, policy: CapacityPolicy) -> float:
    """The capacity to start from, given the engine's measured real-time streams."""
    return max(float(policy.floor), realtime_streams * SEED_SHARE)


def _percentile(values: deque[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class DoorController:
    """The automatic door.  Pure: every reading comes with ``now``."""

    def __init__(self, capacity: float, policy: CapacityPolicy) -> None:
        self.policy = policy
        #: real-time streams the machine serves now
        self.capacity = min(float(policy.ceiling), max(float(policy.floor), capacity))
        #: the average speaking share of an admitted session
        self.share = policy.prior_share
        #: streams speaking, averaged over ``speaking_average_s``
        self.speaking = 0.0
        #: the load signal: 10th-percentile slack of the window (None: too few samples)
        self.slack_p10: float | None = None
        self._slack: deque[float] = deque(maxlen=policy.window)
        self._cut_at = -math.inf
        self._rose_at = -math.inf
        self._read_at: float | None = None
        self.limit = self._limit()

    @property
    def overcommit(self) -> float:
        """Admitted sessions ÷ capacity: how many times what the machine
        serves they would ask if all spoke at once."""
        return self.limit / self.capacity

    def update(
        self, now: float, lateness: Lateness, admitted: int, speaking: int, waiting: int
    ) -> int:
        """The limit after a reading: the engine's work since the last one,
        the sessions admitted, how many of them speak, how many wait at the door."""
        p = self.policy
        interval = 0.0 if self._read_at is None else max(0.0, now - self._read_at)
        self._read_at = now
        if admitted:
            weight = min(1.0, interval / p.share_average_s)
            self.share += weight * (min(1.0, speaking / admitted) - self.share)
        weight = min(1.0, interval / p.speaking_average_s) if interval else 1.0
        self.speaking += weight * (speaking - self.speaking)
        self._slack.extend(lateness.slack_s)
        self.slack_p10 = (
            _percentile(self._slack, 0.1) if len(self._slack) >= p.min_samples else None
        )
        if self.slack_p10 is not None:
            speaking_now = max(self.speaking, float(speaking))
            if self.slack_p10 < p.tight_s and now - self._cut_at >= p.hold_s and speaking_now >= 1:
                # (with nobody speaking, the late work was of sessions gone)
                self.capacity = max(float(p.floor), min(self.capacity, speaking_now) * p.cut_factor)
                self._cut_at = now
                self._slack.clear()
                self.slack_p10 = None
            elif (
                self.slack_p10 > p.ample_s
                and waiting
                and speaking >= math.floor(self.capacity)  # the capacity is in use
                and now - self._rose_at >= p.rise_every_s
                and now - self._cut_at >= p.hold_s
            ):
                self.capacity = min(float(p.ceiling), self.capacity + p.rise_step)
                self._rose_at = now
                self._slack.clear()  # the next rise reads the load this one admits
                self.slack_p10 = None
        self.limit = self._limit()
        return self.limit

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
    while True:
        await asyncio.sleep(TICK_S)
        lateness = read()
        if lateness is None:
            continue
        before, talking = controller.limit, speaking()
        limit = controller.update(clock(), lateness, gate.active, talking, gate.depth)
        if report is not None:
            report(controller, talking)
        if limit != before:
            log.info(
                "admission: door %d -> %d sessions (capacity %.1f streams, share %.2f,"
                " %d admitted, %d speaking, %d waiting, slack p10 %s; last %.2f s:"
                " %d of %d items late, busiest thread %.2f s)",
                before,
                limit,
                controller.capacity,
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
