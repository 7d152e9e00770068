"""The machinery every engine shares: delivery, the look-ahead bound, cancel
and the session's budget, written once.

What this module is for: an engine's model work runs in worker threads; the
session consumes a segment's events on the event loop.  ``DeliveredJob`` is
the one ``SynthesisJob`` implementation between the two:

* **Delivery**: a worker thread hands word timings and chunks to the job
  (``timings``, ``chunk``, ``finish``); they reach the consumer's ``async
  for`` through ``loop.call_soon_threadsafe``.  The first chunk waits (at
  most ``ALIGNMENT_WAIT_S``) for the segment's word timings when alignment
  was asked for, so timings never follow the audio they describe.
* **Look-ahead bound**: before producing a chunk the engine asks
  ``acquire``; it is refused while ``MAX_UNDELIVERED`` produced chunks wait
  for the consumer, and the ``wake`` callback given is called when the
  consumer takes one.  A job nobody reads holds a bounded amount of audio and
  uses no compute.
* **Budget**: a streamed utterance carries the session's ``Budget``
  (``max_buffered_ms``): ``acquire`` reserves the chunk's duration and is
  refused while the budget is full (the budget calls ``wake`` after its next
  release).  The session releases as it writes the audio out; a cancelled or
  finished job's leftover reservation is released here.
* **Cancel**: thread-safe and idempotent; hooks registered with ``on_cancel``
  stop a model call in flight (onnxruntime's ``RunOptions.terminate``).
  ``acquire`` and ``started`` refuse a cancelled job, so at most the chunk in
  flight completes and work not started never starts.

``DeliveryStream`` is the base of every engine's per-utterance stream
(``submit`` never raises: a failure to start becomes the job's
``SynthesisError``), ``LiveJobs`` the engine-wide gauge, and ``ChunkedWork``
with ``pump`` the driver for an engine without a scheduler of its own: each
step runs in a worker thread, waiting on the event loop (never in a thread)
for the bound and the budget.

What it must not do: compute, or block the event loop (the only blocking
wait, for word timings, happens in the engine's worker thread).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import numpy as np

from gateway.engines.base import (
    AudioChunk,
    EngineEvent,
    EngineStream,
    SegmentRequest,
    SegmentStats,
    StreamRequest,
    SynthesisError,
    SynthesisJob,
    WordTimings,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger(__name__)

#: produced chunks a job may hold that the consumer has not taken yet
MAX_UNDELIVERED = 2
#: longest a first chunk waits for its word timings (computed alongside it)
ALIGNMENT_WAIT_S = 1.0


class _End:
    """Marks the end of a job's event stream."""


_END = _End()
_Delivery = EngineEvent | _End | SynthesisError


class DeliveredJob(SynthesisJob):
    """One segment: the producer side is called from worker threads, the
    consumer side (``async for``, ``cancel``) from the event loop or anywhere."""

    def __init__(
        self,
        segment: SegmentRequest,
        request: StreamRequest,
        index: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.segment = segment
        self.request = request
        #: position in its utterance's stream (0: the utterance's first segment)
        self.index = index
        #: its first chunk jumps the queue (engines with a scheduler read it)
        self.first_in_utterance = index == 0 and request.first_audio_priority
        self.stats = SegmentStats()
        self._loop = loop
        self._events: asyncio.Queue[_Delivery] = asyncio.Queue()
        self._lock = threading.Lock()
        self._submitted = time.perf_counter()
        self._cancelled = False
        self._finished = False
        self._iterated = False
        self._undelivered = 0
        self._bound_wake: Callable[[], None] | None = None
        self._on_cancel: list[Callable[[], None]] = []
        self._on_done: list[Callable[[DeliveredJob], None]] = []
        #: set once word timings were delivered or none are due
        self._timings_settled = threading.Event()
        if not request.alignment:
            self._timings_settled.set()

    # --- state ------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def finished(self) -> bool:
        """Ended: completed, failed or cancelled."""
        return self._finished

    @property
    def text(self) -> str:
        return self.segment.text

    def undelivered(self) -> int:
        with self._lock:
            return self._undelivered

    def on_cancel(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the job is cancelled (at once if it already is):
        stop a model call in flight.  Runs on the cancelling thread."""
        with self._lock:
            if not self._cancelled:
                self._on_cancel.append(hook)
                return
        hook()

    def on_done(self, hook: Callable[[DeliveredJob], None]) -> None:
        """Call ``hook(job)`` once when the job ends (before the consumer sees
        the end), however it ends."""
        with self._lock:
            if not self._finished:
                self._on_done.append(hook)
                return
        hook(self)

    # --- producer side (worker threads) -------------------------------------------

    def started(self) -> bool:
        """The engine begins this segment's work: False if it was cancelled
        (then the work must not start).  Records ``queue_ms``."""
        if self._cancelled or self._finished:
            return False
        self.stats.queue_ms = (time.perf_counter() - self._submitted) * 1e3
        return True

    def acquire(self, seconds: float, wake: Callable[[], None]) -> bool:
        """May the engine produce the next chunk (``seconds`` long)?  False if
        the job ended, if ``MAX_UNDELIVERED`` chunks wait for the consumer or
        if the session's budget is full; ``wake`` is then called once there
        may be room (the consumer took a chunk, the budget was released, the
        job was cancelled).  On True the chunk's duration is reserved."""
        with self._lock:
            if self._cancelled or self._finished:
                return False
            if self._undelivered >= MAX_UNDELIVERED:
                self._bound_wake = wake
                return False
        budget = self.request.budget
        return budget is None or budget.reserve(self, seconds, wake)

    def timings(self, timings: WordTimings) -> None:
        """Deliver the segment's word timings (only when alignment was asked)."""
        try:
            if self.request.alignment and not self._cancelled:
                self._deliver(timings)
        finally:
            self._timings_settled.set()

    def skip_timings(self) -> None:
        """No word timings will come for this segment."""
        self._timings_settled.set()

    def chunk(self, samples: np.ndarray) -> bool:
        """Deliver a produced chunk; False (and dropped) if the job was
        cancelled meanwhile.  The first chunk waits for the timings."""
        if not self._timings_settled.is_set():
            self._timings_settled.wait(ALIGNMENT_WAIT_S)
        with self._lock:
            self.stats.chunks += 1
            if self._cancelled or self._finished:
                return False
            if self.stats.audio_samples == 0 and not self.stats.first_chunk_ms:
                self.stats.first_chunk_ms = (time.perf_counter() - self._submitted) * 1e3
            self.stats.audio_samples += int(samples.shape[0])
            self._undelivered += 1
        self._deliver(AudioChunk(samples))
        return True

    def finish(self, error: SynthesisError | None = None) -> None:
        """The segment is complete (or failed with ``error``).  Idempotent."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
            hooks, self._on_done = self._on_done, []
        self._timings_settled.set()
        for hook in hooks:  # before the end marker: the consumer may look at once
            hook(self)
        self._deliver(error if error is not None else _END)
        if self.request.budget is not None and (self._cancelled or error is not None):
            self.request.budget.release(self)  # its audio will never be sent

    def fail(self, message: str) -> None:
        """Finish with a ``SynthesisError`` (logged by the caller)."""
        self.finish(SynthesisError(message))

    # --- consumer side ----------------------------------------------------------------

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled or self._finished:
                return
            self._cancelled = True
            self.stats.cancelled = True
            hooks, self._on_cancel = self._on_cancel, []
            wake, self._bound_wake = self._bound_wake, None
        for hook in hooks:
            hook()
        self.finish()
        if wake is not None:
            wake()  # a producer waiting for room learns the job ended

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        completed = False
        try:
            while True:
                event = await self._events.get()
                if isinstance(event, _End):
                    completed = True
                    return
                if isinstance(event, SynthesisError):
                    completed = True
                    raise event
                if isinstance(event, AudioChunk):
                    with self._lock:
                        self._undelivered -= 1
                        wake, self._bound_wake = self._bound_wake, None
                    if wake is not None:
                        wake()
                yield event
        finally:
            if not completed:  # the consumer left early: stop the work
                self.cancel()

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        if self._iterated:
            raise RuntimeError("a synthesis job is iterated once")
        self._iterated = True
        return self._iterate()

    # --- delivery -----------------------------------------------------------------------

    def _deliver(self, item: _Delivery) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, item)
        except RuntimeError:  # loop closed: nobody is listening any more
            self.cancel()


class LiveJobs:
    """An engine's jobs submitted and not ended (a gauge, and who to cancel
    at shutdown).  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: set[DeliveredJob] = set()

    def add(self, job: DeliveredJob) -> None:
        with self._lock:
            self._jobs.add(job)
        job.on_done(self._discard)

    def _discard(self, job: DeliveredJob) -> None:
        with self._lock:
            self._jobs.discard(job)

    def snapshot(self) -> list[DeliveredJob]:
        with self._lock:
            return list(self._jobs)

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)

    def cancel_all(self) -> None:
        for job in self.snapshot():
            job.cancel()


class DeliveryStream(EngineStream):
    """The base of every engine's per-utterance stream.  A subclass
    implements ``start`` (queue the segment's work; it may keep state across
    the utterance's segments on ``self``); this class numbers the segments,
    turns a failure to start into the job's ``SynthesisError``, tracks the
    live jobs and cancels them."""

    def __init__(self, request: StreamRequest, live: LiveJobs | None = None) -> None:
        self.request = request
        self._live = live
        self._count = 0
        self._jobs: list[DeliveredJob] = []
        self._cancelled = False
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, segment: SegmentRequest) -> SynthesisJob:
        job = DeliveredJob(segment, self.request, self._count, asyncio.get_running_loop())
        self._count += 1
        if self._cancelled:
            job.cancel()
            return job
        self._jobs = [j for j in self._jobs if not j.finished]
        self._jobs.append(job)
        if self._live is not None:
            self._live.add(job)
        try:
            self.start(job)
        except SynthesisError as exc:
            job.finish(exc)
        except Exception as exc:  # a bug or a model error: this segment fails alone
            log.exception("segment could not start (%s)", self.request.label)
            job.fail(f"synthesis failed: {type(exc).__name__}")
        return job

    @abc.abstractmethod
    def start(self, job: DeliveredJob) -> None:
        """Begin ``job``'s work (queue it on a worker); must not block.
        Raising ``SynthesisError`` fails this segment only."""

    def cancel(self) -> None:
        self._cancelled = True
        for job in list(self._jobs):  # a copy: safe from another thread
            job.cancel()

    def close(self) -> None:
        self._closed = True


class ChunkedWork(abc.ABC):
    """One segment's model work as blocking steps, for an engine without a
    scheduler of its own: ``pump`` runs each step in a worker thread."""

    @abc.abstractmethod
    def prepare(self) -> tuple[WordTimings | None, Sequence[float]]:
        """Text analysis / acoustic stage (blocking; counted as the stage
        ``acoustic_ms``): the word timings (None if the engine has none) and
        each chunk's duration in seconds."""

    @abc.abstractmethod
    def decode(self, index: int) -> np.ndarray:
        """Chunk ``index`` (blocking): float32 samples at the native rate."""


_pumps: set[asyncio.Task[None]] = set()


def pump(job: DeliveredJob, work: ChunkedWork) -> None:
    """Run ``work`` for ``job`` now: steps in worker threads, the waits for
    the bound and the budget on the event loop.  Must be called on the loop."""
    task = asyncio.get_running_loop().create_task(_pump(job, work), name="engine-pump")
    _pumps.add(task)
    task.add_done_callback(_pumps.discard)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def wait_for_room(job: DeliveredJob, seconds: float) -> bool:
    """Wait on the event loop until ``job`` may produce a chunk of
    ``seconds`` (the look-ahead bound and the session budget); False if the
    job ended meanwhile.  For engines whose work runs on the loop (a relay)."""
    loop = asyncio.get_running_loop()
    while True:
        woken = loop.create_future()

        def wake(woken: asyncio.Future[None] = woken) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(_settle, woken)

        if job.acquire(seconds, wake):
            return True
        if job.finished:
            return False
        await woken


async def _pump(job: DeliveredJob, work: ChunkedWork) -> None:
    try:
        if not job.started():
            return
        t0 = time.perf_counter()
        timings, durations = await asyncio.to_thread(work.prepare)
        job.stats.add_stage("acoustic_ms", (time.perf_counter() - t0) * 1e3)
        job.stats.audio_seconds = float(sum(durations))
        if timings is not None:
            job.timings(timings)
        else:
            job.skip_timings()
        for index, seconds in enumerate(durations):
            if not await wait_for_room(job, seconds):
                return
            t0 = time.perf_counter()
            samples = await asyncio.to_thread(work.decode, index)
            job.stats.add_stage("decode_ms", (time.perf_counter() - t0) * 1e3)
            if not job.chunk(samples):
                return
        job.finish()
    except Exception as exc:  # the model failed: this segment fails alone
        if not job.cancelled:
            # the exception's text is for the log only: it may name paths,
            # addresses or model internals, which never reach a client
            log.warning("synthesis failed (%s): %r", job.request.label, exc)
            job.fail(f"synthesis failed: {type(exc).__name__}")
