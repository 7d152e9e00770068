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

Threads.  A worker may serve its queue with several threads (``threads``):
the earliest due item goes to the first free thread, so the deadline order
holds across them.  An engine whose items of one job must not run at once
keeps at most one item of a job queued or running (Piper's segments queue
their next item when the last one ran).

What it must not do: run anything on the event loop, or hold a queue that can
grow without bound: each job keeps at most one item queued here at a time, so
the queue is bounded by the number of live jobs.
"""

from __future__ import annotations

import abc
import itertools
import logging
import queue
import threading
import time
from collections import deque

from gateway.flow.capacity import Lateness

log = logging.getLogger(__name__)


#: an item that waited longer than this in the queue waited behind other work
CONTENDED_S = 0.02
#: slack samples kept between two ``take_lateness`` calls (the newest)
SLACK_KEPT = 256


class WorkItem(abc.ABC):
    """One unit of work; the earliest ``due`` runs first."""

    @abc.abstractmethod
    def due(self) -> float:
        """When the work must be done (``time.monotonic()`` seconds)."""

    @abc.abstractmethod
    def run(self) -> None:
        """Do the work and deliver the result; must not raise."""


class DeadlineWorker:
    """Daemon threads serving ``WorkItem``s from one priority queue."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self.name = name
        #: (due, order, queued at, item)
        self._queue: queue.PriorityQueue[tuple[float, int, float, WorkItem | None]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()
        self._threads = [
            threading.Thread(
                target=self._serve, name=name if i == 0 else f"{name}-{i + 1}", daemon=True
            )
            for i in range(max(1, threads))
        ]
        self._started = False
        self._closed = False
        #: threads running an item now
        self.running = 0
        self._stats_lock = threading.Lock()
        self._finished = 0
        self._late = 0
        self._busy_s = [0.0] * len(self._threads)
        self._slack: deque[float] = deque(maxlen=SLACK_KEPT)

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
        if self._closed:
            raise RuntimeError(f"worker {self.name} is closed")
        self._queue.put((item.due(), next(self._order), time.monotonic(), item))

    def active(self) -> bool:
        """Running an item or holding one (read from other threads)."""
        return self.busy or not self._queue.empty()

    def depth(self) -> int:
        """Items waiting (not counting the one running)."""
        return self._queue.qsize()

    def take_lateness(self) -> Lateness:
        """Items finished since the last call and how many were late (any thread)."""
        with self._stats_lock:
            taken = Lateness(self._finished, self._late, max(self._busy_s), tuple(self._slack))
            self._finished = self._late = 0
            self._busy_s = [0.0] * len(self._threads)
            self._slack.clear()
        return taken

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the item in flight; items still queued are dropped."""
        if self._closed:
            return
        self._closed = True
        # sorts before every real item, so nothing queued runs after close;
        # each thread puts it back for the next one
        self._queue.put((float("-inf"), -1, 0.0, None))
        if self._started:
            deadline = time.monotonic() + timeout
            for thread in self._threads:
                thread.join(max(0.0, deadline - time.monotonic()))

    def _serve(self) -> None:
        index = next(i for i, t in enumerate(self._threads) if t is threading.current_thread())
        while True:
            due, order, queued_at, item = self._queue.get()
            if item is None:
                self._queue.put((due, order, queued_at, item))
                return
            with self._stats_lock:
                self.running += 1
            started = time.monotonic()
            try:
                item.run()
            except Exception:  # an item must not kill the worker serving everyone
                log.exception("work item failed in %s", self.name)
            finally:
                with self._stats_lock:
                    self.running -= 1
            finished = time.monotonic()
            waited = started - queued_at > CONTENDED_S
            late = waited and finished > due
            with self._stats_lock:
                self._finished += 1
                self._late += late
                self._busy_s[index] += finished - started
                if waited or finished <= due:
                    self._slack.append(due - finished)
