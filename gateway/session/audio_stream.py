"""The audio path of a session: segments in, protocol events and frames out.

An ``AudioStream`` owns a FIFO of segments and one task that speaks them in
order: it submits each segment to its utterance's engine stream (one
``EngineStream`` per utterance, opened at its first segment, cancelled with
it, closed once its text is complete; the next segment is submitted
while the current one decodes, so the engine's acoustic stage overlaps the
vocoder and consecutive segments join without a gap), resamples and frames
the chunks, and sends ``audio.start`` / ``alignment`` / binary / ``audio.done``
and the closing ``session.done``.

With ``raw`` framing a session has one stream shared by all contexts (their
audio never interleaves; first-in first-out at sentence granularity).  With
``tagged`` framing each context has its own stream and their frames
interleave, ordered by the engine's earliest-deadline scheduling.

A stream sees its session only through ``StreamEnv`` (what it needs to
speak) and ``StreamHost`` (what it tells the session core, which answers
with the messages to send): this module imports nothing of
``gateway.session.core``.  The segment bookkeeping (order, one-ahead prefetch) is
``gateway.text.queue``, shared with the HTTP API.

The session buffer (``max_buffered_ms``) is the session's ``DecodeBudget``
(``gateway.flow.budget``),
passed to the engine with each streamed segment: the engine reserves a
chunk before decoding it and this module releases it once the chunk's
frames are written, so a session whose sends are held stops decoding.
The next segment is prefetched only while the budget has room (``unsent_ms``
measures the same quantity from the jobs' statistics, as an independent
check for the tests).  The
segment about to be spoken is always submitted, so a full buffer never
delays a context's first audio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gateway import protocol
from gateway.audio.encoding import encode
from gateway.audio.framing import FrameFlags, Framer, TaggedHeader, pack_header
from gateway.audio.resample import StreamResampler
from gateway.audio.wav import wav_bytes, wav_header
from gateway.engines.base import (
    AudioChunk,
    Engine,
    EngineStream,
    SegmentRequest,
    StreamRequest,
    SynthesisError,
    SynthesisJob,
    WordTimings,
)
from gateway.errors import ErrorCode
from gateway.flow.budget import DecodeBudget
from gateway.ops.metrics import Metrics
from gateway.session.contexts import Context
from gateway.session.utterance import Sentence, Utterance
from gateway.text.duration import estimate_seconds
from gateway.text.queue import SegmentQueue
from gateway.text.stage import SilentJob, pause_ms, pause_samples
from gateway.ws.outbound import ConnectionGone

log = logging.getLogger(__name__)


class Sender(Protocol):
    """The session's one bounded way out (``gateway.ws.outbound.Outbound``)."""

    @property
    def gone(self) -> bool: ...

    async def event(self, message: protocol.ServerMessage) -> None: ...

    async def audio(self, payload: bytes) -> None: ...


class StreamHost(Protocol):
    """What a stream tells its session.  The session core answers with the
    messages to send; the stream sends them, in order with its audio."""

    def segment_ended(self, ctx: Context) -> list[protocol.ServerMessage]:
        """A segment of ``ctx`` is done: ``session.done`` of the utterances
        that are now complete."""
        ...

    def cancelled_audio_ended(
        self, ctx: Context, open_sentence: Sentence | None, sent_bytes: int, *, delivered: bool
    ) -> list[protocol.ServerMessage]:
        """The last frame of cancelled audio of ``ctx`` went out (or, if not
        ``delivered``, the connection is gone): the cancel reports waiting for it."""
        ...

    def connection_lost(self) -> None:
        """A send failed: stop all of the session's work."""
        ...


@dataclass(frozen=True)
class StreamEnv:
    """What an ``AudioStream`` needs of its session, and nothing more."""

    engine: Engine
    #: native rate of each engine voice, by canonical name
    voice_rates: Mapping[str, int]
    #: the session buffer (``max_buffered_ms``), shared by its streams
    budget: DecodeBudget
    out: Sender
    metrics: Metrics
    label: str  #: the session id, for engine logs
    log: logging.LoggerAdapter[logging.Logger]
    host: StreamHost


@dataclass
class Segment:
    context: Context
    utterance: Utterance
    sentence: Sentence
    job: SynthesisJob | None = None
    #: the front-end's reading of the sentence (a worker thread); None: none
    read: asyncio.Future[None] | None = None
    #: audio of this segment sent (output ms) and the voice's native rate,
    #: for the session buffer count
    sent_ms: float = 0.0
    voice_rate: int = 0

    def unsent_ms(self) -> float:
        """Decoded by the engine and not yet sent (0 without a live job)."""
        if self.job is None or self.utterance.cancelled or not self.voice_rate:
            return 0.0
        decoded_ms = self.job.stats.audio_samples * 1000 / self.voice_rate
        return max(0.0, decoded_ms - self.sent_ms)


class AudioStream:
    def __init__(self, env: StreamEnv, name: str) -> None:
        self.env = env
        self.name = name
        # the next segment is prefetched only while the session buffer has
        # room (its decode would otherwise add to a full buffer), once the
        # front-end has read it
        self.segments: SegmentQueue[Segment] = SegmentQueue(
            self._submit, room=lambda: not env.budget.full and self._head_read()
        )
        self._wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @property
    def queue(self) -> deque[Segment]:
        """Segments waiting behind the current one."""
        return self.segments.waiting

    @property
    def current(self) -> Segment | None:
        """The segment being spoken."""
        return self.segments.current

    # -- called by the session (reader side) ------------------------------
    def enqueue(self, segment: Segment) -> None:
        self._read(segment)
        self.segments.append(segment)
        self._wake.set()
        if self.task is None:
            self.task = asyncio.create_task(self._run(), name=f"stream-{self.name}")

    # -- the text front-end, off the event loop ----------------------------
    # Reading a segment costs up to about 0.5 ms of CPU at p99 (0.7 ms
    # measured here under load) and 7-9 ms for adversarial text within
    # max_segment_chars (docs/text.md): it runs in a worker thread, one call at a time per
    # utterance (its FrontEnd carries state), chained in commit order.  A
    # segment is submitted to the engine only once read.
    def _read(self, segment: Segment) -> None:
        utt = segment.utterance
        if utt.frontend is None:
            return
        segment.read = utt.reading = asyncio.ensure_future(
            self._read_after(utt.reading, utt.read, segment.sentence)
        )
        segment.read.add_done_callback(lambda _: self.segments.prefetch())

    @staticmethod
    async def _read_after(
        before: asyncio.Future[None] | None, call: Callable[[Sentence], None], sentence: Sentence
    ) -> None:
        if before is not None:
            await asyncio.wait({before})
        try:
            await asyncio.to_thread(call, sentence)
        except Exception:  # a front-end bug must not stop the session
            log.exception("the text front-end failed; the sentence is read as written")

    def finish_reading(self, utterance: Utterance) -> None:
        """The utterance's text is complete (``input.done``): the front-end's
        end-of-text check runs after its last read (at once if none is left)."""
        pending = utterance.reading
        if pending is None or pending.done():
            utterance.finish_reading()  # a check of carried state: no parsing
            return
        utterance.reading = asyncio.ensure_future(self._finish_after(pending, utterance))

    @staticmethod
    async def _finish_after(before: asyncio.Future[None], utterance: Utterance) -> None:
        await asyncio.wait({before})
        utterance.finish_reading()

    def _head_read(self) -> bool:
        head = self.queue[0] if self.queue else None
        return head is None or head.read is None or head.read.done()

    def drop_utterances(self, utterances: list[Utterance]) -> None:
        """Remove these utterances' queued segments and cancel their jobs."""
        self.segments.drop(lambda s: s.utterance in utterances)
        for utterance in utterances:
            if utterance.engine_stream is not None:
                utterance.engine_stream.cancel()

    def unsent_ms(self) -> float:
        """Decoded but unsent audio of this stream's segments (debug, bound)."""
        return sum(s.unsent_ms() for s in self.segments)

    def has_work_for(self, context: Context) -> bool:
        return (self.current is not None and self.current.context is context) or any(
            s.context is context for s in self.queue
        )

    def close_if_complete(self, utterance: Utterance) -> None:
        """Tell the utterance's engine stream that no segment will follow
        once ``input.done`` arrived and none is queued or being spoken."""
        stream = utterance.engine_stream
        done = utterance.done_received and not self.has_work_for_utterance(utterance)
        if stream is not None and done:
            stream.close()

    def has_next_for(self, utterance: Utterance) -> bool:
        return any(s.utterance is utterance for s in self.queue)

    def has_work_for_utterance(self, utterance: Utterance) -> bool:
        return (
            self.current is not None and self.current.utterance is utterance
        ) or self.has_next_for(utterance)

    def cancel_jobs(self) -> None:
        """Stop the engine work of every segment (the connection is gone)."""
        self.segments.cancel_jobs()

    async def stop(self) -> None:
        self.segments.clear()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None

    def discard(self) -> None:
        """Stop the task of a stream with no work left (its context was forgotten)."""
        if self.task is not None and not self.segments:
            self.task.cancel()
            self.task = None

    # -- the task ---------------------------------------------------------
    def _submit(self, segment: Segment) -> None:
        utterance = segment.utterance
        config = utterance.config
        start = utterance.first_audio_at
        deadline = (time.monotonic() if start is None else start) + self._audio_ahead_s(utterance)
        env = self.env
        segment.voice_rate = env.voice_rates[config.voice]
        text = segment.sentence.engine_text
        if not text.strip():  # nothing to speak: a sentence of no audio
            segment.job = SilentJob()
            return
        # the stream's first segment opens the utterance: its first chunk
        # jumps the engine's queue (StreamRequest.first_audio_priority)
        segment.job = self._engine_stream(segment).submit(
            SegmentRequest(text=text, deadline=deadline)
        )

    def _engine_stream(self, segment: Segment) -> EngineStream:
        utterance = segment.utterance
        if utterance.engine_stream is None:
            config = utterance.config
            utterance.engine_stream = self.env.engine.open_stream(
                StreamRequest(
                    voice=config.voice,
                    language=config.language,
                    speed=config.speed,
                    instructions=config.instructions,
                    options=utterance.options,
                    alignment=True,
                    label=f"{self.env.label}/{segment.context.id or '-'}",
                    # a whole-sentence message needs the whole sentence decoded
                    # before it can be sent, so only streamed audio is budgeted
                    budget=self.env.budget if config.stream_audio else None,
                )
            )
        return utterance.engine_stream

    def _audio_ahead_s(self, utterance: Utterance) -> float:
        """Seconds of the utterance's audio that play before a segment
        submitted now: what was sent, plus what the segment being spoken has
        still to send (its length once the engine knows it, else estimated
        from its text).  The engine serves the earliest deadline first, so a
        prefetched segment must not look as urgent as the audio playing now."""
        ahead = utterance.sent_ms / 1000
        current = self.current
        if current is not None and current.utterance is utterance and current.job is not None:
            total = current.job.stats.audio_seconds
            if total is None:
                total = estimate_seconds(current.sentence.engine_text, utterance.config.speed)
            ahead += max(0.0, total - current.sent_ms / 1000)
        return ahead

    async def _run(self) -> None:
        try:
            while True:
                while not self.queue:
                    self._wake.clear()
                    await self._wake.wait()
                head = self.queue[0]
                if head.read is not None and not head.read.done():
                    await asyncio.wait({head.read})  # the front-end's reading
                    continue  # a cancel may have changed the queue meanwhile
                segment = self.segments.start_next()
                try:
                    await self._speak(segment)
                finally:
                    self.segments.finish()  # the next may have waited for room
                self.close_if_complete(segment.utterance)
                reading = segment.utterance.reading
                if segment.utterance.done_received and reading is not None:
                    await asyncio.wait({reading})  # its end-of-text check
                # a cancel that arrived while audio.done was going out
                await self._report_cancel(segment.context, None, 0)
                await self._send(self.env.host.segment_ended(segment.context))
        except ConnectionGone:
            self.env.host.connection_lost()

    async def _send(self, messages: list[protocol.ServerMessage]) -> None:
        for message in messages:
            await self.env.out.event(message)

    async def _report_cancel(
        self, ctx: Context, open_sentence: Sentence | None, sent_bytes: int
    ) -> None:
        out = self.env.out
        reports = self.env.host.cancelled_audio_ended(
            ctx, open_sentence, sent_bytes, delivered=not out.gone
        )
        await self._send(reports)

    async def _flow_wait(self, ctx: Context, utt: Utterance, frame_ms: float) -> bool:
        """Hold a frame until the context's listener window admits it;
        False if the utterance was cancelled meanwhile (drop the frame)."""
        out = self.env.out
        admitted = await ctx.flow.admit(frame_ms, lambda: utt.cancelled or out.gone)
        if admitted:  # the send clock of the listener-buffer estimate
            ctx.listener.on_sent(frame_ms, time.monotonic())
        return admitted

    def _first_audio(self, utt: Utterance) -> None:
        utt.first_audio_at = time.monotonic()
        if utt.ready_at is not None:
            self.env.metrics.time_to_first_audio.observe(utt.first_audio_at - utt.ready_at)

    def _account_job(self, utt: Utterance, job: SynthesisJob) -> None:
        stats = job.stats
        metrics = self.env.metrics
        utt.compute_ms += stats.compute_ms
        if utt.queue_ms is None:
            utt.queue_ms = stats.queue_ms
        metrics.sentences.inc()
        if stats.extra.get("acoustic_ms"):
            metrics.acoustic_seconds.observe(stats.extra["acoustic_ms"] / 1000)
        if stats.first_chunk_ms:
            metrics.first_chunk_seconds.observe(stats.first_chunk_ms / 1000)

    async def _speak(self, segment: Segment) -> None:
        ctx, utt, sentence = segment.context, segment.utterance, segment.sentence
        config = utt.config
        job = segment.job
        assert job is not None
        out = self.env.out
        sentence.started = True
        sentence.start_ms = utt.sent_ms
        rate = config.sample_rate
        voice_rate = self.env.voice_rates[config.voice]
        if ctx.resampler is None or ctx.resampler_utterance is not utt:
            ctx.resampler = StreamResampler(voice_rate, rate)
            ctx.resampler_utterance = utt
        resampler = ctx.resampler
        framer = Framer(rate, config.frame_ms)
        tagged = config.framing == "tagged"
        if sentence.refused is not None:  # malformed SSML: reported, not spoken
            await out.event(
                protocol.Error(
                    code=ErrorCode.INVALID_SSML,
                    message=f"sentence {sentence.index} is not spoken:"
                    f" {sentence.refused.message} (at character {sentence.refused.position}"
                    " of the utterance's text)",
                    context_id=ctx.id,
                    action="sentence_skipped",
                )
            )
        await out.event(
            protocol.AudioStart(
                context_id=ctx.id,
                utterance_index=utt.index,
                sentence_index=sentence.index,
                sentence_text=sentence.text,
                format=config.response_format,
                encoding=config.encoding,
                sample_rate=rate,
                context_number=ctx.number,
                engine_text=sentence.engine_text if config.debug_engine_text else None,
            )
        )
        pause_before, pause_after = pause_ms(sentence.spoken)
        total_bytes = 0
        samples_sent = 0
        first_frame = True
        pending: list[np.ndarray] = []  # whole-sentence mode

        async def send(payload: bytes, n_samples: int, flags: FrameFlags = FrameFlags.NONE) -> None:
            nonlocal total_bytes, samples_sent, first_frame
            is_audio = not flags & FrameFlags.WAV_HEADER
            if is_audio and not await self._flow_wait(ctx, utt, n_samples * 1000 / rate):
                return  # cancelled while waiting: the frame is dropped, never sent
            if tagged:
                if first_frame:
                    flags |= FrameFlags.FIRST
                header = TaggedHeader(
                    context=ctx.number,
                    utterance_index=utt.index,
                    sequence=ctx.sequence,
                    sample_offset=round(utt.sent_ms * rate / 1000),
                    flags=flags,
                )
                ctx.sequence += 1
                payload_out = pack_header(header) + payload
            else:
                payload_out = payload
            await out.audio(payload_out)
            total_bytes += len(payload)
            first_frame = False
            if is_audio:
                samples_sent += n_samples
                utt.sent_ms += n_samples * 1000 / rate
                segment.sent_ms += n_samples * 1000 / rate
                if utt.first_audio_at is None and n_samples:
                    self._first_audio(utt)

        async def emit(samples: np.ndarray, last: bool = False) -> None:
            if not config.stream_audio:
                pending.append(samples)
                return
            frames = framer.push(samples)
            if last:
                tail = framer.flush()
                if tail is not None and tail.size:
                    frames.append(tail)
            if last and not frames and tagged and not first_frame:
                # the audio ended on a frame boundary: an empty frame carries
                # the last-frame flag
                frames = [np.zeros(0, np.float32)]
            for i, frame in enumerate(frames):
                flags = FrameFlags.LAST if last and i == len(frames) - 1 else FrameFlags.NONE
                await send(encode(frame, config.encoding), frame.size, flags)

        if config.stream_audio and config.response_format == "wav":
            await send(wav_header(rate, config.encoding, None), 0, FrameFlags.WAV_HEADER)

        failed: Exception | None = None
        if pause_before:  # an SSML <break> before the speech: silence made here
            await emit(resampler.process(pause_samples(pause_before, voice_rate)))
        events = job.__aiter__()
        try:
            async for event in events:
                if utt.cancelled:
                    break
                if isinstance(event, WordTimings):
                    words = sentence.set_words(event.words)
                    if config.timestamps:
                        await out.event(
                            protocol.Alignment(
                                context_id=ctx.id,
                                utterance_index=utt.index,
                                sentence_index=sentence.index,
                                # on the client's words, with their offsets
                                words=[
                                    protocol.WordTimestamp(
                                        word=w.text,
                                        start_ms=round(sentence.start_ms + w.start_ms, 1),
                                        end_ms=round(sentence.start_ms + w.end_ms, 1),
                                        char_start=sentence.source_start + w.char_start,
                                        char_end=sentence.source_start + w.char_end,
                                    )
                                    for w in words
                                ],
                            )
                        )
                elif isinstance(event, AudioChunk):
                    await emit(resampler.process(event.samples))
                    if config.stream_audio:  # written to the socket: budget freed
                        self.env.budget.release(job, event.samples.size / voice_rate)
                    self.segments.prefetch()  # sending made room in the session buffer
        except ConnectionGone:
            job.cancel()
            raise
        except (SynthesisError, Exception) as exc:  # the sentence fails, the session goes on
            self.env.log.warning(
                "synthesis failed (context=%s sentence=%d): %r", ctx.id, sentence.index, exc
            )
            job.cancel()
            failed = exc
        finally:
            # close the iterator now (not at garbage collection) so the
            # engine's own cleanup runs when the stream leaves early
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            self._account_job(utt, job)
            self.env.budget.release(job)

        if pause_after and not utt.cancelled and failed is None:
            await emit(resampler.process(pause_samples(pause_after, voice_rate)))
        if not utt.cancelled:
            carry = self.has_next_for(utt) and failed is None
            tail = np.zeros(0, np.float32) if carry else resampler.flush()
            await emit(tail, last=True)
        if not config.stream_audio and pending and not utt.cancelled:
            audio = np.concatenate(pending)
            if config.response_format == "wav":
                payload = wav_bytes(audio, rate, config.encoding)
            else:
                payload = encode(audio, config.encoding)
            await send(payload, audio.size, FrameFlags.LAST)
        if utt.cancelled:
            # frames after the cancel were dropped by _flow_wait: the report
            # follows the last frame that actually went out
            resampler.flush()
            await self._report_cancel(ctx, sentence, total_bytes)
            return
        sentence.audio_ms = samples_sent * 1000 / rate
        sentence.finished = True
        if failed is not None:
            await out.event(
                protocol.Error(
                    code=ErrorCode.INTERNAL,
                    message=f"synthesis of sentence {sentence.index} failed: {failed}",
                    context_id=ctx.id,
                    partial_audio=total_bytes > 0,
                    action="sentence_skipped",
                )
            )
        await out.event(utt.audio_done(ctx.id, sentence, total_bytes, error=failed is not None))
