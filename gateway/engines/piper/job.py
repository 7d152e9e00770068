"""One segment's Piper work: acoustic stage and chunked decode, scheduled.

What this module is for: the model state of a submitted segment shared by the
acoustic worker (phonemes -> durations -> latent, published window by window)
and the decode worker (one chunk at a time), and when each of its work items
is due.  Its decode state is guarded by one lock.

Delivery to asyncio, the look-ahead bound (``delivery.MAX_UNDELIVERED``), the
session's budget and cancel are the shared ``delivery.DeliveredJob``'s: a
segment asks it before each chunk (``acquire``), hands it word timings and
chunks, and it says when the segment was cancelled.  A segment keeps at most
one chunk queued at the decode worker; ``acquire``'s ``wake`` reschedules it.

Cancellation: the job's ``on_cancel`` hook stops a running onnxruntime call
with ``RunOptions.terminate``; the decode worker checks the job right before
it starts a chunk, so at most the chunk already in flight completes; a
segment still queued at the acoustic worker never starts its acoustic work.

What it must not do: compute on the event loop, or block it.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from gateway.engines.base import WordTiming, WordTimings
from gateway.engines.deadline_worker import DeadlineWorker, WorkItem
from gateway.engines.delivery import DeliveredJob
from gateway.engines.piper import alignment, loudness
from gateway.engines.piper.acoustic import Encoded, LatentWindow, plan_flow_windows
from gateway.engines.piper.threads import ThreadPlan
from gateway.engines.workcut import cut_ahead, cut_text
from gateway.vocoders.stateful import ChunkWindow

if TYPE_CHECKING:
    from gateway.engines.piper.voice import ChunkSource, LoadedVoice

log = logging.getLogger(__name__)

#: how long a new utterance's first audio may wait for audio already playing
#: in other sessions.  Its acoustic head and first chunk are due this long
#: after submission, so under load the sessions already speaking keep their
#: audio flowing and new ones start a little later, one after another; alone,
#: nothing competes and it changes nothing.  0.6 s, not the 0.25 s before
#: round 14: a session that has just started holds only its first chunk or
#: two (0.19-0.56 s of audio), so with 0.25 s, twelve sessions starting
#: within a second let the last ones' first audio go before the first ones'
#: next, and those gapped (docs/benchmarks.md, round 14)
FIRST_AUDIO_SLACK_S = 0.6
#: acoustic work is due this long before the audio it feeds plays.  0.5 and
#: 0.8 s were tried (round 18, docs/benchmarks.md): under a burst of
#: sessions fewer streams ran dry where their next sentence starts, but
#: those heads then went before new sessions' first audio at every load
ACOUSTIC_LEAD_S = 0.2
#: at most this many chunks after an utterance's first are merged into it
#: (``LoadedVoice.plan``'s ``merge``)
MAX_MERGE = 2


@dataclass
class Workers:
    """What a segment runs on, shared by all segments of an engine."""

    acoustic: DeadlineWorker
    decode: DeadlineWorker
    threads: ThreadPlan
    #: how many other utterances are starting (their first segment is still
    #: being synthesized)
    others_starting: Callable[[DeliveredJob], int]
    #: the most phonemes one acoustic call reads (``piper.max_item_phonemes``):
    #: a segment over it is spoken as pieces, one after another
    max_phonemes: int = 200
    #: records each acoustic call's phonemes (the engine's largest work item)
    work_item: Callable[[int], None] = lambda _: None


@dataclass(frozen=True)
class _Piece:
    """Where a piece after a segment's first starts (``PiperSegment``)."""

    text: str
    rest: tuple[str, ...]  #: the pieces after it
    tail: str  #: after them, the segment's text not cut yet
    uncut: bool  #: ``text`` is such a tail (may be over the limit)
    deadline: float  #: when its audio plays (the previous piece's end)
    offset_ms: float  #: its audio's start in the segment's audio
    lead_s: float | None  #: the segment's ``_lead_s``


def segment_rng(seed: int | None, ids: Sequence[int]) -> np.random.Generator:
    """The noise generator of one segment: unseeded, or from the request's
    ``seed`` and the segment's phoneme ids, so the same sentence with the
    same seed samples the same noise wherever it falls in an utterance."""
    if seed is None:
        return np.random.default_rng()
    digest = zlib.crc32(np.asarray(ids, dtype=np.int64).tobytes())
    return np.random.default_rng([seed % 2**64, digest])


class PiperSegment:
    """One segment's Piper work, or one piece of it: a segment whose
    phonemes exceed ``Workers.max_phonemes`` is cut (``workcut.cut_text``,
    clause then word boundaries) and each piece is a ``PiperSegment`` of
    its own on the same job, its acoustic item queued once the piece
    before it has decoded its first chunk, its chunks decoded once that
    piece's last one is (the job's audio stays in order)."""

    def __init__(
        self,
        job: DeliveredJob,
        voice: LoadedVoice,
        workers: Workers,
        deterministic: bool,
        piece: _Piece | None = None,
    ) -> None:
        self.job = job
        self.voice = voice
        self.stats = job.stats
        self._workers = workers
        self._deterministic = deterministic
        self.text = job.text if piece is None else piece.text
        self._rest: tuple[str, ...] = () if piece is None else piece.rest
        self._tail = "" if piece is None else piece.tail
        self._uncut = piece is not None and piece.uncut
        self._deadline = job.segment.deadline if piece is None else piece.deadline
        self._first = job.first_in_utterance and piece is None
        self._offset_ms = 0.0 if piece is None else piece.offset_ms
        #: the next piece, made once this one's first chunk is decoded
        self._next: PiperSegment | None = None
        #: a later piece decodes nothing until the piece before it has
        #: decoded its last chunk (``_release``)
        self._held = piece is not None
        self._continues = piece is not None  #: a piece after the segment's first
        #: a stream without first-audio priority (HTTP): how far ahead its
        #: deadline was set when it was submitted (``http_deadline_offset_s``)
        if piece is not None:
            self._lead_s = piece.lead_s
        else:
            self._lead_s = (
                None
                if job.request.first_audio_priority
                else max(0.0, job.segment.deadline - time.monotonic())
            )
        self._lock = threading.Lock()
        self._run_options: ort.RunOptions | None = None
        #: a seeded request repeats its bytes: its kernels run on fixed thread
        #: counts (a count that follows the load changes the last bit)
        self._fixed_threads = job.request.seed is not None
        #: the second flow window's item, queued once the first chunk is decoded
        self._flow_rest: _LatentWindowItem | None = None
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

    @property
    def first_in_utterance(self) -> bool:
        return self._first

    @property
    def deadline(self) -> float:
        return self._deadline

    # --- acoustic stage (acoustic worker thread) -----------------------------------

    def run_acoustic(self) -> None:
        """The acoustic worker's first item for this segment: phonemes,
        encoder, word timings and the first flow window.  Each later flow
        window is an item of its own (``run_flow_window``), due before the
        first chunk that needs it, queued one after another: the second at
        once for a segment that is not first in its utterance and, for a first
        one, once its first chunk is decoded (on a small CPU the flow would
        halve the first chunk's speed); meanwhile the acoustic worker serves
        other segments."""
        if not self._continues and not self.job.started():
            return  # cancelled: never started
        if self.job.finished:
            return  # a later piece of a segment cancelled meanwhile
        run_options = self._run_options = ort.RunOptions()
        self.job.on_cancel(lambda: setattr(run_options, "terminate", True))
        started = time.perf_counter()
        if self._guard(self._acoustic_head):
            self.stats.add_stage("acoustic_ms", (time.perf_counter() - started) * 1e3)

    def run_flow_window(self, item: _LatentWindowItem) -> None:
        started = time.perf_counter()
        if self._guard(lambda: self._flow_window(item)):
            elapsed = (time.perf_counter() - started) * 1e3
            self.stats.add_stage("acoustic_ms", elapsed)
            self.stats.extra["flow_ms"] += elapsed

    def _guard(self, work: Callable[[], None]) -> bool:
        """Run acoustic work; a failure ends the segment with an error."""
        if self.job.finished:
            return False
        try:
            work()
        except Exception as exc:  # onnxruntime raises plain exceptions on terminate
            if not self.job.cancelled:
                log.exception("acoustic stage failed (%s)", self.job.request.label)
                self.job.fail(f"synthesis failed: {exc}")
            return False
        return True

    def _acoustic_head(self) -> None:
        voice = self.voice
        run_options = self._run_options
        limit = self._workers.max_phonemes
        # a tail not cut yet is cut at once, never phonemized whole (it may be
        # long: the cut looks at a window of it, ``workcut.cut_ahead``)
        phonemes = [] if self._uncut else voice.phonemize(self.text)
        if self._uncut or len(phonemes) > limit:  # bounded work: speak it as pieces

            def measure(text: str) -> int:
                return len(voice.phonemize(text))

            if self._rest:  # a piece cut before, over joined (rare): cut it whole
                pieces = cut_text(self.text, limit, measure)
                self._rest = (*pieces[1:], *self._rest)
            else:
                pieces, self._tail = cut_ahead(self.text, limit, measure)
                self._rest = tuple(pieces[1:])
            self.text = pieces[0]
            phonemes = voice.phonemize(self.text)
        self._workers.work_item(len(phonemes))
        ids, spans = alignment.phoneme_id_spans(phonemes, voice.config.phoneme_id_map)
        if not any(s is not None for s in spans):
            self._end(0)  # nothing speakable (punctuation only)
            return
        scales = voice.scales(self.job.request.speed, self._deterministic)
        t0 = time.perf_counter()
        light = self._workers.threads.acoustic_light(self._fixed_threads)
        encoded = voice.acoustic.encode(
            ids,
            scales,
            run_options=run_options,
            light=light,
            rng=segment_rng(self.job.request.seed, ids),
        )
        self.stats.extra["encoder_ms"] = (time.perf_counter() - t0) * 1e3
        if self.job.cancelled:
            return
        frames = encoded.frames
        self.stats.audio_seconds = (
            self._offset_ms / 1000 + frames * voice.hop_length / voice.sample_rate
        )
        merge = 0
        if self.first_in_utterance and not self._deterministic:
            # one other utterance starting: as usual; two: the first two
            # chunks as one; three or more: the first three.  Measured with
            # the harness, all sessions starting a paragraph at once: 3
            # sessions held with no merging, 4-5 merging two, 6-7 three; a
            # lone session is never affected.  Not in deterministic mode,
            # where identical text must give identical audio whatever the load
            merge = min(MAX_MERGE, max(0, self._workers.others_starting(self.job) - 1))
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
        first_ms = (time.perf_counter() - t0) * 1e3
        if self._continues:
            self.stats.extra["flow_ms"] = self.stats.extra.get("flow_ms", 0.0) + first_ms
        else:
            self.stats.extra["flow_first_ms"] = self.stats.extra["flow_ms"] = first_ms
        # word timings are worked out while the first chunk decodes; the job
        # delivers that chunk after them
        self._deliver_alignment(phonemes, spans, encoded)
        if len(flow) > 1:
            rest = _LatentWindowItem(self, encoded, flow, 1)
            with self._lock:
                now = not self.first_in_utterance or self._next_chunk > 0
                self._flow_rest = None if now else rest
            if now:
                self._workers.acoustic.put(rest)

    def _flow_window(self, item: _LatentWindowItem) -> None:
        window = item.windows[item.index]
        latent = self.voice.acoustic.flow_window(
            item.encoded,
            window,
            run_options=self._run_options,
            light=self._workers.threads.acoustic_light(self._fixed_threads),
        )
        self._publish(window.end, latent, window.start)
        if item.index + 1 < len(item.windows) and not self.job.cancelled:
            self._workers.acoustic.put(
                _LatentWindowItem(self, item.encoded, item.windows, item.index + 1)
            )

    def _deliver_alignment(
        self, phonemes: list[str], spans: list[tuple[int, int] | None], encoded: Encoded
    ) -> None:
        try:
            if self.job.request.alignment and not self.job.cancelled:
                self.job.timings(WordTimings(self._align(phonemes, spans, encoded)))
        finally:
            self.job.skip_timings()

    def _align(
        self, phonemes: list[str], spans: list[tuple[int, int] | None], encoded: Encoded
    ) -> tuple[WordTiming, ...]:
        words = alignment.text_words(self.text)
        ms_per_frame = 1000.0 * self.voice.hop_length / self.voice.sample_rate
        timed = alignment.align_words(
            words,
            self.voice.word_phonemes(words),
            phonemes,
            spans,
            encoded.durations,
            ms_per_frame,
        )
        if not self._offset_ms:
            return timed
        shift = self._offset_ms  # a later piece: times from the segment's start
        return tuple(WordTiming(w.word, w.start_ms + shift, w.end_ms + shift) for w in timed)

    # --- pieces (a segment over ``max_phonemes``) --------------------------------------

    def _start_next(self, frames: int) -> None:
        """Queue the next piece's acoustic work (this piece has ``frames``
        latent frames): due before this piece's audio ends."""
        if not (self._rest or self._tail) or self._next is not None or self.job.finished:
            return
        audio_ms = frames * self.voice.hop_length * 1000 / self.voice.sample_rate
        piece = _Piece(
            text=self._rest[0] if self._rest else self._tail,
            rest=self._rest[1:],
            tail=self._tail if self._rest else "",
            uncut=not self._rest,
            deadline=self.due(frames),
            offset_ms=self._offset_ms + audio_ms,
            lead_s=self._lead_s,
        )
        self._next = PiperSegment(self.job, self.voice, self._workers, self._deterministic, piece)
        self._workers.acoustic.put(AcousticItem(self._next))

    def _end(self, frames: int) -> None:
        """This piece's audio is all delivered: the next piece may decode,
        or the segment is complete."""
        if not (self._rest or self._tail):
            self.job.finish()
            return
        self._start_next(frames)
        assert self._next is not None or self.job.finished
        if self._next is not None:
            self._next._release()

    def _release(self) -> None:
        """The piece before this one has decoded its last chunk."""
        with self._lock:
            self._held = False
        self._schedule_next()

    def covered(self, work: Callable[[], None]) -> float:
        """Run acoustic ``work``; the seconds of audio whose latent it made."""
        before = self._available
        work()
        return max(0, self._available - before) * self.voice.hop_length / self.voice.sample_rate

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
            if self.job.finished or self._scheduled or self._held:
                return
            if self._next_chunk >= len(self._windows):
                return
            window = self._windows[self._next_chunk]
            if window.win_end > self._available:
                return  # the flow has not got there yet
            seconds = (window.end - window.start) * self.voice.hop_length / self.voice.sample_rate
            if not self.job.acquire(seconds, self._schedule_next):
                return  # chunks wait for the consumer or the session's budget is full
            self._scheduled = True
            item = _ChunkItem(self, self._next_chunk, window)
        self._workers.decode.put(item)

    def decode_chunk(self, index: int, window: ChunkWindow) -> float:
        """Decode and deliver one chunk; the seconds of audio it made."""
        with self._lock:
            if self.job.finished:
                self._scheduled = False
                return 0.0  # dropped before its decode began
            latent = self._latent
            decoder = self._decoder
        started = time.perf_counter()
        assert latent is not None and decoder is not None
        self._workers.threads.set_vocoder_threads(
            index == 0 and self.first_in_utterance, self._fixed_threads
        )
        try:
            raw = decoder.decode_chunk(latent, window)
        except Exception as exc:  # torch/onnxruntime errors: fail this segment only
            with self._lock:
                self._scheduled = False
            log.exception("decode failed (%s)", self.job.request.label)
            self.job.fail(f"decode failed: {exc}")
            return 0.0
        audio = loudness.soft_limit(raw * np.float32(self.voice.gain))
        self.stats.add_stage("decode_ms", (time.perf_counter() - started) * 1e3)
        last = index == len(self._windows) - 1
        with self._lock:
            self._next_chunk = index + 1
        if index == 0:
            if not self.job.cancelled:
                self._audio_base = self._first_audio_at(time.monotonic())
            with self._lock:
                rest, self._flow_rest = self._flow_rest, None
            if rest is not None:
                self._workers.acoustic.put(rest)
            self._start_next(self._windows[-1].end)  # one piece ahead, no more
        # still scheduled while it is handed over: one chunk at a time, and the
        # job counts it as undelivered before the next is considered
        delivered = self.job.chunk(audio)
        with self._lock:
            self._scheduled = False
        made = len(audio) / self.voice.sample_rate
        if not delivered:
            return made  # cancel() arrived while this chunk was in flight
        if last:
            self._end(self._windows[-1].end)
        else:
            self._schedule_next()
        return made

    # --- scheduling: every work item is due at a time (earliest first) ---------------

    def due(self, frame: int) -> float:
        """When the audio of latent ``frame`` plays: counted from this
        segment's first decoded chunk once there is one (for a first segment,
        that is when its listener starts hearing it), else from the request's
        deadline."""
        base = self._audio_base if self._audio_base is not None else self.deadline
        return base + frame * self.voice.hop_length / self.voice.sample_rate

    def _first_audio_at(self, decoded: float) -> float:
        """Where the segment's audio starts on the schedule, its first chunk
        decoded at ``decoded``.  A live stream's listener hears it from then
        on.  A stream without first-audio priority (HTTP) has a deadline
        ``http_deadline_offset_s`` ahead and keeps that lead for its later
        chunks too (they are due as if its listener were that far behind):
        otherwise, from its second chunk on, a response running faster than
        real time would be due before a new response's first chunk and a
        conversation's next chunk alike."""
        if self._lead_s is None:
            return decoded
        return max(decoded, self.deadline)

    def _not_overdue(self, due: float, before_s: float = 0.0) -> float:
        """``due`` for a live stream.  A stream without first-audio priority
        (HTTP) that has fallen behind its schedule queues its next item as
        due its lead (less ``before_s``) from now, as a new response's first
        item is: once every response runs late, they take turns, an item
        each, instead of the one furthest behind going first, so a new
        response's first audio waits for one item of each other response
        rather than for all of them.  Live audio due within the lead still
        goes first."""
        if self._lead_s is None:
            return due
        return max(due, time.monotonic() + self._lead_s - before_s)

    def head_due(self) -> float:
        """The acoustic head: a new utterance's first audio may wait
        ``FIRST_AUDIO_SLACK_S`` for audio already playing; a later segment's
        head must finish ``ACOUSTIC_LEAD_S`` before it plays."""
        if self.first_in_utterance:
            return self.deadline + FIRST_AUDIO_SLACK_S
        return self.deadline - ACOUSTIC_LEAD_S

    def chunk_due(self, index: int, window: ChunkWindow) -> float:
        if index == 0 and self.first_in_utterance:
            return self.head_due()  # the new utterance's first audio
        return self._not_overdue(self.due(window.start))

    def flow_window_due(self, window: LatentWindow) -> float:
        """A lead before the first chunk that needs this window plays."""
        start = next((w.start for w in self._windows if w.win_end > window.start), 0)
        return self._not_overdue(self.due(start) - ACOUSTIC_LEAD_S, ACOUSTIC_LEAD_S)


class _ChunkItem(WorkItem):
    def __init__(self, segment: PiperSegment, index: int, window: ChunkWindow) -> None:
        self.segment = segment
        self.index = index
        self.window = window

    def due(self) -> float:
        return self.segment.chunk_due(self.index, self.window)

    def run(self) -> None:
        self.audio_s = self.segment.decode_chunk(self.index, self.window)


class _LatentWindowItem(WorkItem):
    """Flow window ``windows[index]`` (index >= 1) of a job."""

    def __init__(
        self, segment: PiperSegment, encoded: Encoded, windows: list[LatentWindow], index: int
    ) -> None:
        self.segment = segment
        self.encoded = encoded
        self.windows = windows
        self.index = index

    def due(self) -> float:
        return self.segment.flow_window_due(self.windows[self.index])

    def run(self) -> None:
        self.audio_s = self.segment.covered(lambda: self.segment.run_flow_window(self))


class AcousticItem(WorkItem):
    def __init__(self, segment: PiperSegment) -> None:
        self.segment = segment

    def due(self) -> float:
        return self.segment.head_due()

    def run(self) -> None:
        self.audio_s = self.segment.covered(self.segment.run_acoustic)
