"""The orpheus engine's decode worker: one thread that decodes the new SNAC
frames of every active segment in one batch per tick.

What this module is for: the model compute of the engine, off the event
loop, shared by every session.  Each segment being generated has a
``DecodeStream``: the event loop pushes the token ids vLLM streams
(``push``, mapped to frames by ``codes.CodeMapper`` with its
resynchronisation), the worker thread takes them.  Each tick the worker
takes up to ``MAX_FRAMES_PER_TICK`` pending frames of every stream that has
room and decodes them with one ``snac_stream.SnacBatch`` (streams join when
their first frame comes and leave when they end: the batch's carried state
is stacked per stream, so streams of any age decode together; ``step``
groups them by frame count).

Priority: a stream that has not delivered audio yet (a new segment; the
utterance's first segment before the others) is stepped first, in its own
batch, and its audio delivered before the rest of the tick is decoded, so a
new utterance's first audio never waits behind the other streams' work.

Flow control: before decoding, the worker asks the job for room for exactly
the audio the push will release (``DeliveredJob.acquire``: the look-ahead
bound of ``delivery.MAX_UNDELIVERED`` chunks and the session's budget); a
stream without room is skipped (no compute) until the job's ``wake`` calls.
Its frames wait in ``pending``; once ``max_pending`` frames wait, ``push``
waits too, so the HTTP read stops and TCP holds vLLM back.  A stalled
listener therefore holds at most ``max_pending`` frames, the chunks the
delivery bound allows and the session's budget.

A segment may be several generations (bounded work per item, the
engine's ``max_item_chars``): ``next_item()`` between them keeps one
decode stream, so the audio is continuous across the seam.

The end: ``end()`` (the generation finished) lets the worker decode what is
pending, flush the decoder's look-ahead (``SnacBatch.finish``: the last
4757 samples) and finish the job; ``abort()`` (cancel, a failed generation)
drops the stream without another chunk.  A segment that produced no frame
fails ("no speech").

What it must not do: run on the event loop, block on the event loop, use
the ``SnacBatch`` from another thread, or decode for a job that ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Final

import numpy as np

from gateway.engines.delivery import DeliveredJob
from gateway.engines.orpheus.codes import SAMPLE_RATE, CodeMapper, Frame
from gateway.engines.orpheus.tokens import END_OF_SPEECH
from gateway.vocoders.snac_stream import SnacBatch, SnacStreamDecoder

log = logging.getLogger(__name__)

#: frames of one stream decoded in one tick at most (341 ms of audio): a
#: stream that fell behind catches up in chunks the budget can take
MAX_FRAMES_PER_TICK: Final = 4


def released_samples(pushed: int, new: int, per_frame: int, lookahead: int) -> int:
    """Samples the decoder returns when ``new`` frames follow ``pushed``:
    the audio up to ``per_frame * frames - lookahead`` is final."""
    before = max(0, per_frame * pushed - lookahead)
    return max(0, per_frame * (pushed + new) - lookahead) - before


class DecodeStream:
    """One segment's frames, from the event loop to the decode worker."""

    def __init__(self, worker: DecodeWorker, job: DeliveredJob, seed: int) -> None:
        self.worker = worker
        self.job = job
        self.seed = seed
        self.key = next(worker.keys)
        self.mapper = CodeMapper()
        # guarded by worker.cond
        self.pending: list[Frame] = []
        self.ended = False  #: no more frames will come
        self.gone = False  #: leave without another chunk
        self.waiting = False  #: refused room; the job's wake clears it
        self.joined = False
        self.pushed = 0  #: frames pushed into the decoder
        self.samples = 0  #: samples delivered
        self._room: asyncio.Future[None] | None = None
        self._speech_over = False

    # --- event loop side ----------------------------------------------------------

    async def push(self, ids: Sequence[int]) -> bool:
        """Map new token ids to frames and hand them to the worker; waits
        while ``max_pending`` frames wait.  False: the job ended (stop)."""
        if self._speech_over:
            return not self.job.finished
        if END_OF_SPEECH in ids:
            ids = ids[: list(ids).index(END_OF_SPEECH)]
            self._speech_over = True
        frames = self.mapper.push(ids)
        loop = asyncio.get_running_loop()
        with self.worker.cond:
            if self.gone or self.job.finished:
                return False
            self.pending.extend(frames)
            if frames:
                self.worker.cond.notify()
            if len(self.pending) < self.worker.max_pending:
                return True
            room: asyncio.Future[None] = loop.create_future()
            self._room = room
        await room
        return not (self.gone or self.job.finished)

    def next_item(self) -> None:
        """One generation of the segment is complete and the next follows
        (a segment over ``orpheus.max_item_chars`` is several completions):
        its partial frame is dropped, ``<end_of_speech>`` no longer ends the
        stream, and the next generation's frames continue the same decode,
        so the audio runs on across the seam (its look-ahead is released by
        the next frames, not flushed)."""
        self.mapper.finish()
        self._speech_over = False

    def end(self) -> None:
        """The generation is complete: decode the rest, flush, finish the job."""
        self.mapper.finish()
        with self.worker.cond:
            self.ended = True
            self.worker.cond.notify()

    def abort(self) -> None:
        """Drop the stream (cancel, a failed generation); the job is ended by
        the caller.  Thread-safe, idempotent."""
        with self.worker.cond:
            self.gone = True
            self._settle_room()
            self.worker.cond.notify()

    # --- worker side (under worker.cond) ----------------------------------------------

    def _settle_room(self) -> None:
        room, self._room = self._room, None
        if room is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed
                room.get_loop().call_soon_threadsafe(_settle, room)

    def _wake(self) -> None:
        with self.worker.cond:
            self.waiting = False
            self.worker.cond.notify()

    @property
    def runnable(self) -> bool:
        if self.gone or self.job.finished:
            return True  # to be dropped
        return not self.waiting and (bool(self.pending) or self.ended)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class DecodeWorker:
    """The thread that owns the ``SnacBatch``; ``open`` a stream per segment."""

    def __init__(self, decoder: SnacStreamDecoder, max_pending: int) -> None:
        self.decoder = decoder
        self.max_pending = max_pending
        self.cond = threading.Condition()
        self.keys = itertools.count()
        self.batch = SnacBatch(decoder)
        self._streams: list[DecodeStream] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="orpheus-decode", daemon=True)
        self._thread.start()
        #: ticks run and streams decoded (for tests and logs)
        self.ticks = 0

    def open(self, job: DeliveredJob, seed: int) -> DecodeStream:
        stream = DecodeStream(self, job, seed)
        with self.cond:
            self._streams.append(stream)
        return stream

    def active(self) -> int:
        """Segments with a decode stream open."""
        with self.cond:
            return len(self._streams)

    def queued(self) -> int:
        """Segments whose frames wait for the worker (a metrics gauge)."""
        with self.cond:
            return sum(1 for s in self._streams if s.pending)

    def close(self) -> None:
        """Stop the thread (blocking: call from a worker thread)."""
        with self.cond:
            self._stopping = True
            self.cond.notify()
        self._thread.join()

    # --- the thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self._stopping and not any(s.runnable for s in self._streams):
                    self.cond.wait()
                if self._stopping:
                    return
                work, ending, leaving = self._take()
            try:
                self._tick(work, ending, leaving)
            except Exception:  # a bug or a device error: fail these segments, keep serving
                log.exception("orpheus decode tick failed")
                for stream in [*work, *ending]:
                    stream.job.fail("decoding the audio failed")
                    self._drop(stream)

    def _take(self) -> tuple[dict[DecodeStream, list[Frame]], list[DecodeStream], list[int]]:
        """Under the lock: each runnable stream's frames for this tick."""
        work: dict[DecodeStream, list[Frame]] = {}
        ending: list[DecodeStream] = []
        leaving: list[int] = []
        kept: list[DecodeStream] = []
        for stream in self._streams:
            if stream.gone or stream.job.finished:
                stream._settle_room()
                if stream.joined:
                    leaving.append(stream.key)
                    stream.joined = False  # it leaves the batch in this tick
                continue
            kept.append(stream)
            if stream.waiting:
                continue
            if stream.pending:
                work[stream] = stream.pending[:MAX_FRAMES_PER_TICK]
                del stream.pending[:MAX_FRAMES_PER_TICK]
                if len(stream.pending) < self.max_pending:
                    stream._settle_room()
            elif stream.ended:
                ending.append(stream)
        self._streams = kept
        return work, ending, leaving

    def _room(self, stream: DecodeStream, samples: int) -> bool:
        """Room for ``samples`` of this stream's audio (reserved on True)."""
        if samples == 0:
            return True
        with self.cond:
            stream.waiting = True  # before asking: a wake may come at once
        if stream.job.acquire(samples / SAMPLE_RATE, stream._wake):
            with self.cond:
                stream.waiting = False
            return True
        return False

    def _tick(
        self,
        work: dict[DecodeStream, list[Frame]],
        ending: list[DecodeStream],
        leaving: list[int],
    ) -> None:
        self.ticks += 1
        if leaving:
            self.batch.leave_many(leaving)
        decoder = self.decoder
        per_frame, lookahead = decoder.samples_per_frame, decoder.lookahead_samples
        ready: list[tuple[DecodeStream, list[Frame]]] = []
        for stream, frames in work.items():
            out = released_samples(stream.pushed, len(frames), per_frame, lookahead)
            if self._room(stream, out):
                ready.append((stream, frames))
            else:  # no room: the frames wait, in order, for the job's wake
                with self.cond:
                    stream.pending[:0] = frames
        joining = [s for s, _ in ready if not s.joined]
        if joining:
            self.batch.join_many([(s.key, s.seed) for s in joining])
            for s in joining:
                s.joined = True
        # first audio first: streams that delivered nothing yet, the
        # utterance's first segment ahead of the others
        first = [(s, f) for s, f in ready if s.samples == 0]
        first.sort(key=lambda item: not item[0].job.first_in_utterance)
        rest = [(s, f) for s, f in ready if s.samples > 0]
        for group in (first, rest):
            if group:
                self._step(group)
        self._finish(ending)

    def _step(self, group: list[tuple[DecodeStream, list[Frame]]]) -> None:
        t0 = time.perf_counter()
        out = self.batch.step({s.key: f for s, f in group})
        ms = (time.perf_counter() - t0) * 1e3 / len(group)
        for stream, frames in group:
            stream.pushed += len(frames)
            stream.job.stats.add_stage("decode_ms", ms)
            self._deliver(stream, out[stream.key])

    def _finish(self, ending: list[DecodeStream]) -> None:
        flushing: list[DecodeStream] = []
        for stream in ending:
            if not stream.joined:
                stream.job.fail("the model produced no speech for this segment")
                continue
            tail = stream.pushed * self.decoder.samples_per_frame - stream.samples
            if self._room(stream, tail):
                flushing.append(stream)
            # else still ending, and still listed (``_take`` kept it): tried
            # again after the wake.  Listing it again made the next tick end
            # it twice, which broke the batch for every stream in it
        if not flushing:
            return
        t0 = time.perf_counter()
        out = self.batch.finish([s.key for s in flushing])
        ms = (time.perf_counter() - t0) * 1e3 / len(flushing)
        for stream in flushing:
            stream.joined = False  # finish removed it from the batch
            stream.job.stats.add_stage("decode_ms", ms)
            self._deliver(stream, out[stream.key])
            mapper = stream.mapper
            stats = stream.job.stats
            stats.audio_seconds = stream.samples / SAMPLE_RATE
            stats.extra["frames"] = float(mapper.frames)
            stats.extra["dropped_tokens"] = float(mapper.dropped_tokens)
            if mapper.dropped_tokens:
                log.info(
                    "orpheus segment (%s): %d tokens off the frame layout dropped",
                    stream.job.request.label,
                    mapper.dropped_tokens,
                )
            stream.job.finish()

    def _deliver(self, stream: DecodeStream, samples: np.ndarray) -> None:
        if samples.size == 0:
            return
        if stream.job.chunk(np.ascontiguousarray(samples, dtype=np.float32)):
            stream.samples += int(samples.size)
        else:
            self._drop(stream)

    def _drop(self, stream: DecodeStream) -> None:
        with self.cond:
            stream.gone = True
            stream._settle_room()
            if stream not in self._streams and stream.joined:
                self._streams.append(stream)  # so the next tick makes it leave
