"""One segment's synthesis: acoustic stage, chunked decode, delivery to asyncio.

What this module is for: the state of a submitted segment shared by three
threads: the acoustic worker (phonemes -> durations -> latent, published
window by window), the decode worker (one chunk at a time) and the event loop
(the consumer iterating the job).  Everything shared is guarded by one lock.

Flow control: a job has at most one chunk queued at the decode worker, and the
worker decodes the next chunk only while fewer than ``MAX_UNDELIVERED`` decoded
chunks wait for the consumer; the consumer taking a chunk schedules the next.
So a job nobody reads holds a bounded amount of audio and uses no compute.

Cancellation: ``cancel()`` flags the job under the lock, stops a running
onnxruntime call with ``RunOptions.terminate`` and ends the iterator.  The
decode worker checks the flag under the same lock right before it starts a
chunk, so at most the chunk already in flight completes; a job still queued at
the acoustic worker never starts its acoustic work.

What it must not do: compute on the event loop, or block it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from gateway.engines.base import (
    AudioChunk,
    EngineEvent,
    JobStats,
    SynthesisError,
    SynthesisJob,
    SynthesisRequest,
    WordTiming,
    WordTimings,
)
from gateway.engines.decode_worker import DecodeWorker, WorkItem
from gateway.engines.piper import alignment, loudness
from gateway.engines.piper.acoustic import Encoded, FlowWindow, plan_flow_windows
from gateway.engines.piper.threads import ThreadPlan
from gateway.vocoders.stateful import ChunkWindow

if TYPE_CHECKING:
    from gateway.engines.piper.voice import ChunkSource, LoadedVoice

log = logging.getLogger(__name__)

#: decoded chunks a job may hold that the consumer has not taken yet
MAX_UNDELIVERED = 2
#: longest a first chunk waits for its word timings (computed alongside it)
ALIGNMENT_WAIT_S = 1.0
#: how long a new utterance's first audio may wait for audio already playing
#: in other sessions.  Its acoustic head and first chunk are due this long
#: after submission, so under load the sessions already speaking keep their
#: audio flowing and new ones start a little later, one after another; alone,
#: nothing competes and it changes nothing.
FIRST_AUDIO_SLACK_S = 0.25
#: acoustic work is due this long before the audio it feeds plays
ACOUSTIC_LEAD_S = 0.2


class _End:
    """Marks the end of a job's event stream."""


_END = _End()
_Delivery = EngineEvent | _End | SynthesisError


@dataclass
class Workers:
    """What a job runs on, shared by all jobs of an engine."""

    acoustic: DecodeWorker
    decode: DecodeWorker
    threads: ThreadPlan
    #: how many other utterances are starting (their first segment is still
    #: being synthesized)
    others_starting: Callable[[PiperJob], int]


class PiperJob(SynthesisJob):
    def __init__(
        self,
        request: SynthesisRequest,
        voice: LoadedVoice,
        workers: Workers,
        loop: asyncio.AbstractEventLoop,
        deterministic: bool,
        on_finished: Callable[[PiperJob], None],
    ) -> None:
        self.request = request
        self.voice = voice
        self.stats = JobStats()
        self._workers = workers
        self._loop = loop
        self._deterministic = deterministic
        self._on_finished = on_finished
        self._events: asyncio.Queue[_Delivery] = asyncio.Queue()
        self._lock = threading.Lock()
        self._submitted = time.perf_counter()
        self._cancelled = False
        self._finished = False
        self._run_options: ort.RunOptions | None = None
        #: set once word timings were delivered (or none are due): the first
        #: chunk waits for it so the timings always come first
        self._aligned = threading.Event()
        #: the second flow window's item, queued once the first chunk is decoded
        self._flow_rest: _FlowWindowItem | None = None
        #: when the first chunk was decoded (monotonic): later chunks are due
        #: from then on
        self._audio_base: float | None = None
        # decode state (guarded by _lock)
        self._windows: list[ChunkWindow] = []
        self._latent: np.ndarray | None = None
        self._decoder: ChunkSource | None = None
        self._available = 0
        self._next_chunk = 0
        self._scheduled = False
        self._undelivered = 0

    # --- public -------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled or self._finished:
                return
            self._cancelled = True
            self.stats.cancelled = True
            run_options = self._run_options
        if run_options is not None:
            run_options.terminate = True
        self._finish()
        if self.request.budget is not None:
            self.request.budget.release(self)  # its audio will never be sent

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
                    self._schedule_next()
                yield event
        finally:
            if not completed:  # the consumer left early: stop the work
                self.cancel()

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    def undelivered(self) -> int:
        with self._lock:
            return self._undelivered

    # --- delivery -----------------------------------------------------------------

    def _deliver(self, item: _Delivery) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, item)
        except RuntimeError:  # loop closed: nobody is listening any more
            self.cancel()

    def _finish(self, error: SynthesisError | None = None) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
        self._aligned.set()
        self._on_finished(self)  # before the end marker: the consumer may look at once
        self._deliver(error if error is not None else _END)

    # --- acoustic stage (acoustic worker thread) -----------------------------------

    def run_acoustic(self) -> None:
        """The acoustic worker's first item for this job: phonemes, encoder,
        word timings and the first flow window.  Each later flow window is an
        item of its own (``run_flow_window``), due before the first chunk that
        needs it, queued one after another: the second at once for a segment
        that is not first in its utterance and, for a first one, once its
        first chunk is decoded (on a small CPU the flow would halve the first
        chunk's speed); meanwhile the acoustic worker serves other jobs."""
        with self._lock:
            if self._cancelled:
                return  # never started
            self._run_options = ort.RunOptions()
        started = time.perf_counter()
        self.stats.queue_ms = (started - self._submitted) * 1e3
        if self._guard(self._acoustic_head):
            self.stats.acoustic_ms += (time.perf_counter() - started) * 1e3

    def run_flow_window(self, item: _FlowWindowItem) -> None:
        started = time.perf_counter()
        if self._guard(lambda: self._flow_window(item)):
            elapsed = (time.perf_counter() - started) * 1e3
            self.stats.acoustic_ms += elapsed
            self.stats.extra["flow_ms"] += elapsed

    def _guard(self, work: Callable[[], None]) -> bool:
        """Run acoustic work; a failure ends the job with an error."""
        if self._cancelled:
            return False
        try:
            work()
        except Exception as exc:  # onnxruntime raises plain exceptions on terminate
            if not self._cancelled:
                log.exception("acoustic stage failed (%s)", self.request.label)
                self._finish(SynthesisError(f"synthesis failed: {exc}"))
            return False
        return True

    def _acoustic_head(self) -> None:
        voice = self.voice
        run_options = self._run_options
        phonemes = voice.phonemize(self.request.text)
        ids, spans = alignment.phoneme_id_spans(phonemes, voice.config.phoneme_id_map)
        if not any(s is not None for s in spans):
            self._finish()  # nothing speakable (punctuation only)
            return
        scales = voice.scales(self.request.speed, self._deterministic)
        t0 = time.perf_counter()
        light = self._workers.threads.acoustic_light()
        encoded = voice.acoustic.encode(ids, scales, run_options=run_options, light=light)
        self.stats.extra["encoder_ms"] = (time.perf_counter() - t0) * 1e3
        if self._cancelled:
            return
        frames = encoded.frames
        self.stats.audio_seconds = frames * voice.hop_length / voice.sample_rate
        merge = 0
        if self.request.first_in_utterance and not self._deterministic:
            # one other utterance starting: as usual; two: the first two
            # chunks as one; three or more: the first three.  Measured with
            # the harness, all sessions starting a paragraph at once: 3
            # sessions held with no merging, 4-5 merging two, 6-7 three; a
            # lone session is never affected.  Not in deterministic mode,
            # where identical text must give identical audio whatever the load
            merge = min(2, max(0, self._workers.others_starting(self) - 1))
        windows = voice.plan(frames, merge)
        with self._lock:
            self._windows = windows
            self._latent = np.empty((encoded.z_p.shape[0], frames), dtype=np.float32)
            self._decoder = voice.open_decoder(frames, encoded.extras)
        if not voice.streaming:
            self._deliver_alignment(phonemes, spans, encoded)
            self._publish(frames, voice.acoustic.flow_whole(encoded))
            return
        t0 = time.perf_counter()
        flow = plan_flow_windows(frames, windows[0].win_end)
        first = flow[0]
        self._publish(
            first.end,
            voice.acoustic.flow_window(encoded, first, run_options=run_options, light=light),
        )
        self.stats.extra["flow_first_ms"] = self.stats.extra["flow_ms"] = (
            time.perf_counter() - t0
        ) * 1e3
        # word timings are worked out while the first chunk decodes; that
        # chunk is delivered after them
        self._deliver_alignment(phonemes, spans, encoded)
        if len(flow) > 1:
            rest = _FlowWindowItem(self, encoded, flow, 1)
            with self._lock:
                now = not self.request.first_in_utterance or self._next_chunk > 0
                self._flow_rest = None if now else rest
            if now:
                self._workers.acoustic.put(rest)

    def _flow_window(self, item: _FlowWindowItem) -> None:
        window = item.windows[item.index]
        latent = self.voice.acoustic.flow_window(
            item.encoded,
            window,
            run_options=self._run_options,
            light=self._workers.threads.acoustic_light(),
        )
        self._publish(window.end, latent, window.start)
        if item.index + 1 < len(item.windows) and not self._cancelled:
            self._workers.acoustic.put(
                _FlowWindowItem(self, item.encoded, item.windows, item.index + 1)
            )

    def _deliver_alignment(
        self, phonemes: list[str], spans: list[tuple[int, int] | None], encoded: Encoded
    ) -> None:
        try:
            if self.request.alignment and not self._cancelled:
                self._deliver(WordTimings(self._align(phonemes, spans, encoded)))
        finally:
            self._aligned.set()

    def _align(
        self, phonemes: list[str], spans: list[tuple[int, int] | None], encoded: Encoded
    ) -> tuple[WordTiming, ...]:
        words = alignment.text_words(self.request.text)
        ms_per_frame = 1000.0 * self.voice.hop_length / self.voice.sample_rate
        return alignment.align_words(
            words,
            self.voice.word_phonemes(words),
            phonemes,
            spans,
            encoded.durations,
            ms_per_frame,
        )

    def _publish(self, end: int, latent: np.ndarray, start: int = 0) -> None:
        with self._lock:
            if self._latent is None:
                return
            self._latent[:, start:end] = latent
            self._available = end
        self._schedule_next()

    # --- decode stage (decode worker thread) ---------------------------------------

    def _schedule_next(self) -> None:
        with self._lock:
            if self._cancelled or self._finished or self._scheduled:
                return
            if self._next_chunk >= len(self._windows):
                return
            if self._undelivered >= MAX_UNDELIVERED:
                return  # backpressure: the consumer takes a chunk, then we go on
            window = self._windows[self._next_chunk]
            if window.win_end > self._available:
                return  # the flow has not got there yet
            budget = self.request.budget
            seconds = (window.end - window.start) * self.voice.hop_length / self.voice.sample_rate
            if budget is not None and not budget.reserve(self, seconds, self._schedule_next):
                return  # the session holds enough unsent audio: decode pauses
            self._scheduled = True
            item = _ChunkItem(self, self._next_chunk, window)
        self._workers.decode.put(item)

    def decode_chunk(self, index: int, window: ChunkWindow) -> None:
        with self._lock:
            if self._cancelled or self._finished:
                self._scheduled = False
                return  # dropped before its decode began
            latent = self._latent
            decoder = self._decoder
            started = time.perf_counter()
        assert latent is not None and decoder is not None
        self._workers.threads.set_vocoder_threads(index == 0 and self.request.first_in_utterance)
        try:
            raw = decoder.decode_chunk(latent, window)
        except Exception as exc:  # torch/onnxruntime errors: fail this segment only
            with self._lock:
                self._scheduled = False
            log.exception("decode failed (%s)", self.request.label)
            self._finish(SynthesisError(f"decode failed: {exc}"))
            return
        audio = loudness.soft_limit(raw * np.float32(self.voice.gain))
        now = time.perf_counter()
        last = index == len(self._windows) - 1
        with self._lock:
            self._scheduled = False  # still set while in flight: one chunk at a time
            self.stats.decode_ms += (now - started) * 1e3
            self.stats.chunks_decoded += 1
            if self._cancelled:
                # cancel() arrived while this chunk was in flight; it still counts
                # as decoded but is not delivered
                return
            if index == 0:
                self.stats.first_chunk_ms = (now - self._submitted) * 1e3
                self._audio_base = time.monotonic()
            self.stats.audio_samples += int(audio.shape[0])
            self._next_chunk = index + 1
            self._undelivered += 1
        if index == 0:
            with self._lock:
                rest, self._flow_rest = self._flow_rest, None
            if rest is not None:
                self._workers.acoustic.put(rest)
            self._aligned.wait(ALIGNMENT_WAIT_S)
        self._deliver(AudioChunk(audio))
        if last:
            self._finish()
        else:
            self._schedule_next()

    # --- scheduling: every work item is due at a time (earliest first) ---------------

    def due(self, frame: int) -> float:
        """When the audio of latent ``frame`` plays: counted from this
        segment's first decoded chunk once there is one (for a first segment,
        that is when its listener starts hearing it), else from the request's
        deadline."""
        base = self._audio_base if self._audio_base is not None else self.request.deadline
        return base + frame * self.voice.hop_length / self.voice.sample_rate

    def head_due(self) -> float:
        """The acoustic head: a new utterance's first audio may wait
        ``FIRST_AUDIO_SLACK_S`` for audio already playing; a later segment's
        head must finish ``ACOUSTIC_LEAD_S`` before it plays."""
        if self.request.first_in_utterance:
            return self.request.deadline + FIRST_AUDIO_SLACK_S
        return self.request.deadline - ACOUSTIC_LEAD_S

    def chunk_due(self, index: int, window: ChunkWindow) -> float:
        if index == 0 and self.request.first_in_utterance:
            return self.head_due()  # the new utterance's first audio
        return self.due(window.start)

    def flow_window_due(self, window: FlowWindow) -> float:
        """A lead before the first chunk that needs this window plays."""
        start = next((w.start for w in self._windows if w.win_end > window.start), 0)
        return self.due(start) - ACOUSTIC_LEAD_S


class _ChunkItem(WorkItem):
    def __init__(self, job: PiperJob, index: int, window: ChunkWindow) -> None:
        self.job = job
        self.index = index
        self.window = window

    def due(self) -> float:
        return self.job.chunk_due(self.index, self.window)

    def run(self) -> None:
        self.job.decode_chunk(self.index, self.window)


class _FlowWindowItem(WorkItem):
    """Flow window ``windows[index]`` (index >= 1) of a job."""

    def __init__(
        self, job: PiperJob, encoded: Encoded, windows: list[FlowWindow], index: int
    ) -> None:
        self.job = job
        self.encoded = encoded
        self.windows = windows
        self.index = index

    def due(self) -> float:
        return self.job.flow_window_due(self.windows[self.index])

    def run(self) -> None:
        self.job.run_flow_window(self)


class AcousticItem(WorkItem):
    def __init__(self, job: PiperJob) -> None:
        self.job = job

    def due(self) -> float:
        return self.job.head_due()

    def run(self) -> None:
        self.job.run_acoustic()
