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

Lateness, the admission's load signal (``gateway.flow.capacity``): an item
that finished after it was due *and* had waited in the queue behind other
work is late because the worker is overloaded (an item that is due the
moment it is queued, because its text came late, is not: it did not wait).
``take_lateness`` returns the count since the last call, with the seconds
spent running items (how busy the worker was).

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

from gateway.flow.capacity import Lateness

log = logging.getLogger(__name__)


#: an item that waited longer than this in the queue waited behind other work
CONTENDED_S = 0.02


class WorkItem(abc.ABC):
    """One unit of work; the earliest ``due`` runs first."""

    @abc.abstractmethod
    def due(self) -> float:
        """When the work must be done (``time.monotonic()`` seconds)."""

    @abc.abstractmethod
    def run(self) -> None:
        """Do the work and deliver the result; must not raise."""


class DeadlineWorker:
    """A daemon thread serving ``WorkItem``s from a priority queue."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: (due, order, queued at, item)
        self._queue: queue.PriorityQueue[tuple[float, int, float, WorkItem | None]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._started = False
        self._closed = False
        self.busy = False
        self._stats_lock = threading.Lock()
        self._finished = 0
        self._late = 0
        self._busy_s = 0.0

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

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
            taken = Lateness(self._finished, self._late, self._busy_s)
            self._finished = self._late = 0
            self._busy_s = 0.0
        return taken

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the item in flight; items still queued are dropped."""
        if self._closed:
            return
        self._closed = True
        # sorts before every real item, so nothing queued runs after close
        self._queue.put((float("-inf"), -1, 0.0, None))
        if self._started:
            self._thread.join(timeout)

    def _serve(self) -> None:
        while True:
            due, _, queued_at, item = self._queue.get()
            if item is None:
                return
            self.busy = True
            started = time.monotonic()
            try:
                item.run()
            except Exception:  # an item must not kill the worker serving everyone
                log.exception("work item failed in %s", self.name)
            finally:
                self.busy = False
            finished = time.monotonic()
            late = started - queued_at > CONTENDED_S and finished > due
            with self._stats_lock:
                self._finished += 1
                self._late += late
                self._busy_s += finished - started
