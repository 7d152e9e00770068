"""Automatic admission: as many WebSocket slots as the engine serves on time.

What this module is for: with ``max_active_streams = 0`` (the default), the
number of utterances that stream at once is not a fixed guess but follows
the machine, for an engine whose compute is the gateway's own (one that
reports ``Engine.take_lateness``: Piper).  Two parts:

* **The start** (``seed_limit``): at start the gateway measures how many
  seconds of audio the engine produces per second with two streams at once
  (``gateway.engines.throughput``) and starts from ``SEED_SHARE`` of it.  A
  stream that speaks in real time needs one second of audio a second, but
  conversations cut their text into short segments, start new utterances and
  want their first audio within a bound, so they get fewer than the raw
  figure: on the 2-core reference machine the capacity ladder held 2
  LLM-paced conversations where the probe measured 7.4 (``docs/benchmarks.md``,
  "Automatic admission").
* **Following the load** (``SlotController``): every ``TICK_S`` the engine
  says how much of its work finished late after waiting behind other work,
  and how busy its busiest worker was.  Late work means the admitted streams
  are more than the machine serves: the limit drops to one below the streams
  in progress (no stream is stopped; the next grant waits until one ends),
  cut again at most every ``hold_s`` (a cut takes effect only as streams
  end).  The limit rises by one every ``rise_every_s`` while requests wait,
  every slot is taken, nothing ran late for the calm (``hold_s``, doubled by
  each cut up to ``max_calm_s``, back to ``hold_s`` after ``max_calm_s`` with
  no late work) and the busiest worker is busy less than ``rise_below`` of
  the time (late work shows only once the streams that cause it speak, so a
  rise needs room as well as calm).  The machine's speed varies (one phase
  of the 2-core reference VM is twice as slow as another), so the limit is
  found again rather than fixed at start.  It stays within ``[floor,
  ceiling]``; an idle server keeps its limit.

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
from collections.abc import Callable
from dataclasses import dataclass

from gateway.flow.admission import AdmissionGate

log = logging.getLogger(__name__)

#: of the engine's measured real-time streams, the share the start admits
SEED_SHARE = 0.25
#: how often ``follow`` reads the engine
TICK_S = 0.25
#: the span the busy share is averaged over
BUSY_AVERAGE_S = 1.0


@dataclass(frozen=True)
class Lateness:
    """An engine's work over an interval: items finished, how many of them
    finished late after waiting behind other work, and the seconds its
    busiest worker spent running items."""

    finished: int = 0
    late: int = 0
    busy_s: float = 0.0


@dataclass(frozen=True)
class CapacityPolicy:
    floor: int = 1
    #: the most slots the automatic limit grants (the app passes ``max_sessions``)
    ceiling: int = 64
    #: while requests wait and nothing runs late, one more slot this often
    rise_every_s: float = 0.5
    #: no further cut for this long after one (a cut takes effect only as
    #: streams end); and, at first, the calm after late work a rise needs
    hold_s: float = 1.0
    #: no rise while the busiest worker is busier than this (its share of the
    #: time in the last reading, or averaged over about a second, whichever is
    #: higher): room is needed for one more stream, and late work shows only
    #: after the streams that cause it speak
    rise_below: float = 0.7
    #: each cut doubles the calm a rise needs after late work, up to this
    #: (a limit that keeps finding the same ceiling stops probing it every
    #: second); it falls back to ``hold_s`` after this long with no late work
    max_calm_s: float = 8.0


def seed_limit(realtime_streams: float, policy: CapacityPolicy) -> int:
    """The limit to start from, given the engine's measured real-time streams."""
    return _clamp(math.floor(realtime_streams * SEED_SHARE + 0.5), policy)


def _clamp(limit: int, policy: CapacityPolicy) -> int:
    return max(policy.floor, min(policy.ceiling, limit))


class SlotController:
    """The automatic limit.  Pure: every reading comes with ``now``."""

    def __init__(self, start: int, policy: CapacityPolicy) -> None:
        self.policy = policy
        self.limit = _clamp(start, policy)
        self._changed_at = -math.inf
        self._cut_at = -math.inf
        self._late_at = -math.inf
        #: the calm after late work a rise needs
        self.calm_s = policy.hold_s
        #: the busiest worker's share of the time: the last interval's or its
        #: average over ~1 s, whichever is higher (None: no interval read yet),
        #: so a burst that has just begun holds a rise as soon as it shows
        self.busy: float | None = None
        self._average: float | None = None
        self._read_at: float | None = None

    def update(self, now: float, lateness: Lateness, active: int, waiting: int) -> int:
        """The limit after a reading: work finished since the last one, the
        slots in use, the requests waiting."""
        p = self.policy
        if self._read_at is not None and now > self._read_at:
            interval = now - self._read_at
            share = min(1.0, lateness.busy_s / interval)
            weight = min(1.0, interval / BUSY_AVERAGE_S)
            average = self._average
            self._average = share if average is None else average + weight * (share - average)
            self.busy = max(share, self._average)
        self._read_at = now
        if lateness.late:
            if now - self._cut_at >= p.hold_s:
                cut = _clamp(min(self.limit, active) - 1, p)
                if cut < self.limit:
                    self.limit = cut
                    self._changed_at = self._cut_at = now
                    self.calm_s = min(p.max_calm_s, self.calm_s * 2)
            self._late_at = now
            return self.limit
        if now - self._late_at >= p.max_calm_s:
            self.calm_s = p.hold_s
        if (
            waiting
            and active >= self.limit
            and now - self._late_at >= self.calm_s
            and now - self._changed_at >= p.rise_every_s
            and self.limit < p.ceiling
            and self.busy is not None
            and self.busy < p.rise_below
        ):
            self.limit += 1
            self._changed_at = now
        return self.limit


async def follow(
    gate: AdmissionGate,
    read: Callable[[], Lateness | None],
    controller: SlotController,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Apply the controller's limit to ``gate`` every ``TICK_S`` until cancelled
    (the app's lifespan runs it as a task)."""
    gate.set_limit(controller.limit)
    while True:
        await asyncio.sleep(TICK_S)
        lateness = read()
        if lateness is None:
            continue
        before = controller.limit
        limit = controller.update(clock(), lateness, gate.active, gate.depth)
        if limit != before:
            log.info(
                "admission limit %d -> %d (%d streaming, %d waiting, %d of %d items late)",
                before,
                limit,
                gate.active,
                gate.depth,
                lateness.late,
                lateness.finished,
            )
            gate.set_limit(limit)
