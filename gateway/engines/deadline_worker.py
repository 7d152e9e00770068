"""A worker thread that runs model work items, the earliest due first.

What this module is for: an engine with a scheduler of its own runs its
model work on these threads, ordered across every session by when the audio
is due (the engine says when: for Piper, ``job.PiperSegment.chunk_due``).
Piper has two: the acoustic worker (text encoder, flow) and the decode
worker (vocoder chunks, one per torch device).  Results go back to asyncio
through ``delivery.DeliveredJob``, which the items call.

Batch size 1 costs no latency: an item runs as soon as the thread is free, it
never waits to fill a batch.  (A batched carried-state vocoder step exists,
``stateful.push_batch``, exact, and measured 6-31% less CPU than one push
each for 2 to 8 streams on the 2-core CPU, none at 16; wired in here in
round 9, it bought no capacity on that CPU and was not landed:
docs/engine.md, "Batched carried-state steps".)

Lateness and slack, the admission's load signal (``gateway.flow.capacity``):
an item that finished after it was due *and* had waited in the queue behind
other work is late because the worker is overloaded (an item that is due the
moment it is queued, because its text came late, is not: it did not wait).
Each finished item's slack (due minus finished) is kept too, except for
items late without waiting (bounded: the last ``SLACK_KEPT`` between two
reads).  ``take_lateness`` returns them since the last call, with the
seconds spent running items (how busy the busiest thread was).

Cost, the admission's measure of what audio costs (``flow.capacity``): each
item's CPU time on its thread (``time.thread_time``) and the seconds of
audio it made or covered (``WorkItem.audio_s``, set by ``run``).  Only items
that ran their model on this one thread (``threads_used``, asked after the
item) count: an item run with every core's intra-op threads leaves part of
its CPU time on threads this clock does not see, and it runs that way only
while the machine has cores to spare, so it says nothing of what an audio
second costs when the cores are contended, which is what admission sizes.

Threads.  A worker may serve its queue with several threads (``threads``):
the earliest due item goes to the first free thread, so the deadline order
holds across them.  An engine whose items of one job must not run at once
keeps at most one item of a job queued or running (Piper's segments queue
their next item when the last one ran).

A lane for due work.  Items are not preempted, so audio due soon that finds
every thread busy waits for one of them to finish.  Work that is not due
for a while (``AHEAD_S``: a stream decoding ahead of its listener, a reader
that reads flat out, an HTTP response with its lead) may therefore hold at
most ``threads - 1`` threads at once while work due soon has come in the
last ``DUE_RECENT_S`` (a live stream is speaking): one thread is then
always idle or running work that is due soon, so a listener's next chunk
waits for at most one item of due work, never for the far-ahead work of
other sessions (issue 28: a canary's gaps beside neighbours reading flat
out).  Work ahead waits until a thread of its lane frees, it comes within
``AHEAD_S`` of its due time, or no due work has come for ``DUE_RECENT_S``:
a machine serving only work ahead (HTTP responses) uses every thread.
With one thread there is no lane.

What it must not do: run anything on the event loop, or hold a queue that can
grow without bound: each job keeps at most one item queued here at a time, so
the queue is bounded by the number of live jobs.
"""

from __future__ import annotations

import abc
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from gateway.flow.capacity import Lateness, StageCost

log = logging.getLogger(__name__)


#: an item that waited longer than this in the queue waited behind other work
CONTENDED_S = 0.02
#: slack samples kept between two ``take_lateness`` calls (the newest)
SLACK_KEPT = 256
#: an item due further than this ahead is work ahead: it may hold at most
#: ``threads - 1`` threads (a live stream's next chunk is due within one
#: chunk, 186-743 ms; an HTTP response's items 2 s ahead)
AHEAD_S = 0.5
#: the lane is kept while work due soon came this recently
DUE_RECENT_S = 1.0


class WorkItem(abc.ABC):
    """One unit of work; the earliest ``due`` runs first."""

    #: seconds of audio this item made (decode) or covered (acoustic): set by ``run``
    audio_s: float = 0.0

    @abc.abstractmethod
    def due(self) -> float:
        """When the work must be done (``time.monotonic()`` seconds)."""

    @abc.abstractmethod
    def run(self) -> None:
        """Do the work and deliver the result; must not raise."""


class DeadlineWorker:
    """Daemon threads serving ``WorkItem``s from one deadline-ordered queue."""

    def __init__(
        self,
        name: str,
        threads: int = 1,
        threads_used: Callable[[], int] = lambda: 1,
        cost_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.name = name
        #: on a worker thread, after an item: the intra-op threads it ran with
        self._threads_used = threads_used
        #: what an item's cost is read from: its thread's CPU clock, or the
        #: wall clock for work on an accelerator (the thread waits for it)
        self._cost_clock = cost_clock
        self._cond = threading.Condition()
        #: (due, order, queued at, item), a heap: the earliest due first
        self._heap: list[tuple[float, int, float, WorkItem]] = []
        self._order = itertools.count()
        self._threads = [
            threading.Thread(
                target=self._serve, name=name if i == 0 else f"{name}-{i + 1}", daemon=True
            )
            for i in range(max(1, threads))
        ]
        #: threads that may run work ahead at once (one stays for due work)
        self._ahead_lanes = max(1, len(self._threads) - 1)
        self._ahead_running = 0
        #: when work due soon was last queued (``time.monotonic()``)
        self._due_seen = float("-inf")
        self._started = False
        self._closed = False
        #: threads running an item now
        self.running = 0
        self._stats_lock = threading.Lock()
        self._finished = 0
        self._late = 0
        self._busy_s = [0.0] * len(self._threads)
        self._slack: deque[float] = deque(maxlen=SLACK_KEPT)
        self._cost = StageCost()
        self._audio_s = 0.0

    @property
    def threads(self) -> int:
        return len(self._threads)

    @property
    def busy(self) -> bool:
        """Some thread is running an item (read from other threads)."""
        return self.running > 0

    def start(self) -> None:
        if not self._started:
            self._started = True
            for thread in self._threads:
                thread.start()

    def put(self, item: WorkItem) -> None:
        due, now = item.due(), time.monotonic()
        with self._cond:
            if self._closed:
                raise RuntimeError(f"worker {self.name} is closed")
            if due - now <= AHEAD_S:
                self._due_seen = now
            heapq.heappush(self._heap, (due, next(self._order), now, item))
            self._cond.notify()

    def active(self) -> bool:
        """Running an item or holding one (read from other threads)."""
        return self.busy or bool(self._heap)

    def depth(self) -> int:
        """Items waiting (not counting the ones running)."""
        return len(self._heap)

    def take_lateness(self) -> Lateness:
        """Items finished since the last call and how many were late (any thread)."""
        with self._stats_lock:
            taken = Lateness(
                self._finished,
                self._late,
                max(self._busy_s),
                tuple(self._slack),
                (self._cost,),
                self._audio_s,
            )
            self._finished = self._late = 0
            self._busy_s = [0.0] * len(self._threads)
            self._slack.clear()
            self._cost = StageCost()
            self._audio_s = 0.0
        return taken

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the items in flight; items still queued are dropped."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()
        if self._started:
            deadline = time.monotonic() + timeout
            for thread in self._threads:
                thread.join(max(0.0, deadline - time.monotonic()))

    def _next(self) -> tuple[float, float, WorkItem, bool] | None:
        """The next item for this thread (due, queued at, item, ahead), once
        one may run; None once closed."""
        with self._cond:
            while not self._closed:
                if not self._heap:
                    self._cond.wait()
                    continue
                now = time.monotonic()
                wait_s = self._heap[0][0] - now - AHEAD_S
                ahead = wait_s > 0
                lane_s = self._due_seen + DUE_RECENT_S - now
                if ahead and lane_s > 0 and self._ahead_running >= self._ahead_lanes:
                    # every lane for work ahead is taken: wait for one to
                    # free, for due work, for this work to come due or for
                    # the lane to lapse
                    self._cond.wait(min(wait_s, lane_s))
                    continue
                due, _, queued_at, item = heapq.heappop(self._heap)
                self._ahead_running += ahead
                if self._heap:
                    self._cond.notify()  # another thread may take the next
                return due, queued_at, item, ahead
            return None

    def _serve(self) -> None:
        index = next(i for i, t in enumerate(self._threads) if t is threading.current_thread())
        while (taken := self._next()) is not None:
            due, queued_at, item, ahead = taken
            with self._stats_lock:
                self.running += 1
            started, cpu = time.monotonic(), self._cost_clock()
            try:
                item.run()
            except Exception:  # an item must not kill the worker serving everyone
                log.exception("work item failed in %s", self.name)
            finally:
                with self._stats_lock:
                    self.running -= 1
                if ahead:
                    with self._cond:
                        self._ahead_running -= 1
                        self._cond.notify()
            finished, cpu = time.monotonic(), self._cost_clock() - cpu
            alone = self._threads_used() == 1
            waited = started - queued_at > CONTENDED_S
            late = waited and finished > due
            with self._stats_lock:
                self._finished += 1
                self._late += late
                self._busy_s[index] += finished - started
                if waited or finished <= due:
                    self._slack.append(due - finished)
                self._audio_s += item.audio_s
                if alone:
                    self._cost = self._cost.add(cpu, item.audio_s)
