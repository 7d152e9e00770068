"""The audio path of a session: segments in, protocol events and frames out.

An ``AudioStream`` owns a FIFO of segments and one task that speaks them in
order: it submits each segment to its utterance's engine stream (one
``EngineStream`` per utterance, opened at its first segment, cancelled with
it, closed once its text is complete; the next segment is submitted
while the current one decodes, so the engine's acoustic stage overlaps the
vocoder and consecutive segments join without a gap), resamples and frames
the chunks, and sends the events about them in order with the frames.

With ``raw`` framing a session has one stream shared by all contexts (their
audio never interleaves; first-in first-out at segment granularity).  With
``tagged`` framing each context has its own stream and their frames
interleave, ordered by the engine's earliest-deadline scheduling.

One writer for each record.  The session core writes the text side of the
contexts, utterances and segments (``gateway.session.utterance``,
``gateway.session.contexts``); this module only reads it.  This module is
the one writer of their audio side, the ledger (``gateway.session.ledger``:
``Context.audio``, ``Utterance.audio``, ``Segment.audio``): a segment's
audio began, its word timings, each message sent (sequence number, sample
offset, bytes, samples), its engine job's figures, its audio complete.  It
builds the events about a segment from those records itself
(``gateway.session.segment_events``: ``audio.start``, ``alignment``,
``audio.done``) and admits each frame with its context's listener
(``gateway.flow.listener``), so a frame costs no call into the core.  It
reports to the core only the session-wide events (``StreamHost``: a
segment left its queue, cancelled audio stopped, an ``ack`` listener went
silent, the connection is gone) and sends the messages the core answers
with.  What belongs to the stream itself is its queue, its utterances'
engine streams and their resamplers (state carried across an utterance's
segments while the next one is queued).  A stream sees its session only
through ``StreamEnv`` and ``StreamHost``: this module imports nothing of
``gateway.session.core``.  How a segment is spoken (its queue with the
one-ahead prefetch, its engine job, its pauses, its audio resampled and a
failure classified) is the delivery pipeline (``gateway.delivery``), shared
with the HTTP API.

The session buffer (``max_buffered_ms``) is the session's ``DecodeBudget``
(``gateway.flow.budget``), passed to the engine with each streamed segment:
the engine reserves a chunk before decoding it and this module releases it
once the chunk's frames are written, so a session whose sends are held
stops decoding.  The job being spoken is marked ``sending``: it may always
take one chunk while it holds nothing, a prefetched job only what fits, so
the buffer holds at most ``max_buffered_ms`` plus one chunk per stream.  The
next segment is prefetched only while the budget has room.  The segment
about to be spoken is always submitted, so a full buffer never delays a
context's first audio.

Failures.  A ``SynthesisError`` fails its segment alone: the client gets an
``error`` with the engine's code (``engine_refused`` when the engine judged
the request invalid, else ``internal``) and ``audio.done`` with ``error:
true``, and the stream goes on.  Any other exception is a bug in the
gateway: the segment fails the same way with ``internal``, the traceback
goes to the log and no exception text to the client.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from gateway import protocol
from gateway.audio.encoding import encode
from gateway.audio.framing import FrameFlags, Framer, TaggedHeader, pack_header
from gateway.audio.resample import StreamResampler
from gateway.audio.wav import wav_bytes, wav_header
from gateway.delivery.queue import SegmentQueue
from gateway.delivery.segment import SegmentAudio, segment_job
from gateway.engines.base import (
    Engine,
    EngineStream,
    SegmentStats,
    StreamRequest,
    SynthesisJob,
    WordTimings,
)
from gateway.errors import GatewayError
from gateway.flow.budget import DecodeBudget
from gateway.flow.listener import ListenerSilent
from gateway.session import segment_events
from gateway.session.contexts import Context
from gateway.session.utterance import Segment, Utterance
from gateway.text.duration import estimate_seconds
from gateway.ws.outbound import ConnectionGone

if TYPE_CHECKING:
    from gateway.ops.metrics import Metrics

log = logging.getLogger(__name__)


class Sender(Protocol):
    """The session's one bounded way out (``gateway.ws.outbound.Outbound``)."""

    @property
    def gone(self) -> bool: ...

    async def event(self, message: protocol.ServerMessage) -> None: ...

    async def audio(self, payload: bytes, counted_as: str | None = None) -> None:
        """``counted_as``: the context a resume counts it in (None: the
        default context, or any context under raw framing)."""
        ...


@dataclass(eq=False)
class QueuedSegment:
    """One segment in a stream's queue: whose it is, and its engine job once
    submitted (the stream's own field)."""

    context: Context
    utterance: Utterance
    segment: Segment
    job: SynthesisJob | None = None
    #: the front-end's reading of the segment (a worker thread, started by
    #: the session core); submitted to the engine only once done
    read: asyncio.Future[None] | None = None


class StreamHost(Protocol):
    """The session-wide events a stream reports to its session core, which
    updates its state and answers with the messages to send; the stream
    sends them, in order with its audio.  Per segment and per frame the
    stream writes its ledger and calls nothing here."""

    def segment_dequeued(self, ctx: Context) -> list[protocol.ServerMessage]:
        """The stream is done with a segment of ``ctx`` (finished, failed or
        cancelled) and has taken it off its queue: ``session.done`` of the
        utterances that are now complete."""
        ...

    def cancelled_audio_ended(
        self, ctx: Context, open_segment: Segment | None, *, delivered: bool
    ) -> list[protocol.ServerMessage]:
        """The last frame of cancelled audio of ``ctx`` went out (or, if not
        ``delivered``, the connection is gone): the cancel reports waiting
        for it (``open_segment``: the one whose audio was cut, if any)."""
        ...

    def connection_lost(self) -> None:
        """A send failed: stop all of the session's work."""
        ...

    def listener_silent(self, ctx: Context) -> list[protocol.ServerMessage]:
        """An ``ack`` listener of ``ctx`` stopped reporting (``ListenerSilent``):
        the ``error`` and the cancel of its utterances."""
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
    label: str  #: the session id, for engine logs
    log: logging.LoggerAdapter[logging.Logger]
    host: StreamHost
    metrics: Metrics


def _failure(segment: Segment, failure: GatewayError | None) -> GatewayError | None:
    """A failed segment as the WebSocket client hears of it: the pipeline's
    code and message, naming the sentence."""
    if failure is None:
        return None
    return GatewayError(failure.code, f"sentence {segment.index}: {failure.message}")


class _SegmentOut:
    """One segment's way out: frames its audio on the config's grid (or
    keeps it whole), waits for the listener, sends, and writes what it sent
    in the ledger."""

    def __init__(self, env: StreamEnv, item: QueuedSegment) -> None:
        self.env = env
        self.item = item
        config = item.utterance.config
        self.config = config
        self.rate = config.sample_rate
        self.framer = Framer(self.rate, config.frame_ms)
        self.tagged = config.framing == "tagged"
        #: the ledger's records this segment's messages are written in
        self.ledger = item.segment.audio
        self._utterance_audio = item.utterance.audio
        self._context_audio = item.context.audio
        self._first_frame = True
        self._whole: list[np.ndarray] = []  #: the audio of a whole-segment message
        #: vllm-omni's ``word_timestamps``: frames go out as ``audio.chunk`` events
        self.chunks = config.word_timestamps
        self._chunk_id = 0

    async def open(self) -> None:
        """The streaming WAV header, if the format has one."""
        if self.config.stream_audio and self.config.response_format == "wav":
            await self._send(wav_header(self.rate, self.config.encoding, None), 0, audio=False)

    async def push(self, samples: np.ndarray, *, last: bool = False) -> None:
        """Audio at the output rate; ``last``: the segment's audio ends here."""
        if not self.config.stream_audio:
            self._whole.append(samples)
            return
        frames = self.framer.push(samples)
        if last:
            tail = self.framer.flush()
            if tail is not None and tail.size:
                frames.append(tail)
            if not frames and self.tagged and not self._first_frame:
                # the audio ended on a frame boundary: an empty frame carries
                # the last-frame flag
                frames = [np.zeros(0, np.float32)]
        for i, frame in enumerate(frames):
            flags = FrameFlags.LAST if last and i == len(frames) - 1 else FrameFlags.NONE
            await self._send(encode(frame, self.config.encoding), frame.size, flags=flags)

    async def send_whole(self) -> None:
        """Without streamed audio: the segment's audio as one message."""
        if self.config.stream_audio or not self._whole:
            return
        audio = np.concatenate(self._whole)
        if self.config.response_format == "wav":
            payload = wav_bytes(audio, self.rate, self.config.encoding)
        else:
            payload = encode(audio, self.config.encoding)
        await self._send(payload, audio.size, flags=FrameFlags.LAST)

    async def _send(
        self,
        payload: bytes,
        samples: int,
        *,
        audio: bool = True,
        flags: FrameFlags = FrameFlags.NONE,
    ) -> None:
        if audio and not await self._admit(samples * 1000 / self.rate):
            return  # cancelled while waiting: the frame is dropped, never sent
        if not audio:
            flags |= FrameFlags.WAV_HEADER
        chunk = self.chunks and audio  # an audio.chunk event: not a binary message
        if chunk:
            await self.env.out.event(self._chunk(payload, samples))
        else:
            frame = self._header(flags) + payload if self.tagged else payload
            await self.env.out.audio(frame, self.item.context.id if self.tagged else None)
        self._first_frame = False
        self._context_audio.message_sent(self.ledger, payload, numbered=self.tagged and not chunk)
        if audio:
            now = time.monotonic()
            if self._utterance_audio.count_sent(self.ledger, samples, self.rate, now):
                ready_at = self.item.utterance.ready_at
                if ready_at is not None:
                    self.env.metrics.time_to_first_audio.observe(now - ready_at)

    def _chunk(
        self,
        payload: bytes,
        samples: int,
        words: list[protocol.ChunkWord] | None = None,
        *,
        last: bool = False,
    ) -> protocol.AudioChunk:
        """vllm-omni 0.30's JSON frame: the samples base64, sentence-relative
        times; ``last``: the sentence's closing chunk, spanning all of it."""
        start = self.ledger.samples
        chunk = protocol.AudioChunk(
            context_id=self.item.context.id,
            utterance_index=self.item.utterance.index,
            sentence_index=self.item.segment.index,
            chunk_id=self._chunk_id,
            chunk_start_ms=0 if last else round(start * 1000 / self.rate),
            chunk_end_ms=round((start + samples) * 1000 / self.rate),
            sample_rate=self.rate,
            audio_b64=base64.b64encode(payload).decode("ascii"),
            timestamps=words,
        )
        self._chunk_id += 1
        return chunk

    async def send_words(self) -> None:
        """vllm-omni's closing ``audio.chunk`` of a sentence: no audio, its
        words' timings (``[]``: none were spoken; null: the engine gave none)."""
        if not self.chunks:
            return
        segment = self.item.segment
        words = (
            ([] if not segment.engine_text.strip() else None)  # nothing to speak: no words
            if segment.audio.words is None
            else [
                protocol.ChunkWord(
                    word=w.text, start_ms=round(w.start_ms, 1), end_ms=round(w.end_ms, 1)
                )
                for w in segment.audio.source_words
            ]
        )
        await self.env.out.event(self._chunk(b"", 0, words, last=True))

    async def _admit(self, frame_ms: float) -> bool:
        """The context's listener admits the frame (and counts it as sent),
        or the utterance was cancelled or the connection lost meanwhile."""
        ctx, utt, out = self.item.context, self.item.utterance, self.env.out
        try:
            return await ctx.listener.admit(frame_ms, lambda: utt.cancelled or out.gone)
        except ListenerSilent:  # the core cancels the utterance: the frame is dropped
            for message in self.env.host.listener_silent(ctx):
                await out.event(message)
            return False

    def _header(self, flags: FrameFlags) -> bytes:
        ctx, utt = self.item.context, self.item.utterance
        if self._first_frame:
            flags |= FrameFlags.FIRST
        return pack_header(
            TaggedHeader(
                context=ctx.number,
                utterance_index=utt.index,
                sequence=ctx.audio.sequence,
                sample_offset=round(utt.audio.sent_ms * self.rate / 1000),
                flags=flags,
            )
        )


class AudioStream:
    def __init__(self, env: StreamEnv, name: str) -> None:
        self.env = env
        self.name = name
        # the next segment is prefetched only while the session buffer has
        # room (its decode would otherwise add to a full buffer), once the
        # front-end has read it
        self.segments: SegmentQueue[QueuedSegment] = SegmentQueue(
            self._submit, room=lambda: not env.budget.full and self._head_read()
        )
        self._wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        #: each utterance's engine stream, from its first segment until it is
        #: closed or cancelled
        self._engine_streams: dict[Utterance, EngineStream] = {}
        #: resampler state carried to an utterance's next segment (queued
        #: when the current one ended); dropped at the flush
        self._resamplers: dict[Utterance, StreamResampler] = {}

    @property
    def queue(self) -> deque[QueuedSegment]:
        """Segments waiting behind the current one."""
        return self.segments.waiting

    @property
    def current(self) -> QueuedSegment | None:
        """The segment being spoken."""
        return self.segments.current

    # -- asked by the session core (reader side) ---------------------------
    def enqueue(self, item: QueuedSegment) -> None:
        self.segments.append(item)
        self._wake.set()
        if self.task is None:
            self.task = asyncio.create_task(self._run(), name=f"stream-{self.name}")

    def read_done(self) -> None:
        """A segment's reading by the front-end ended (the session core runs
        it, ``gateway.session.reading.read``): it may be submitted now."""
        self.segments.prefetch()

    def _head_read(self) -> bool:
        head = self.queue[0] if self.queue else None
        return head is None or head.read is None or head.read.done()

    def cancel(self, utterances: list[Utterance]) -> bool:
        """Stop these utterances: remove their queued segments and cancel
        their engine work.  True if one of them is being spoken now: its
        cancel report follows its last frame (``cancelled_audio_ended``)."""
        self.segments.drop(lambda s: s.utterance in utterances)
        for utterance in utterances:
            stream = self._engine_streams.pop(utterance, None)
            if stream is not None:
                stream.cancel()
        current = self.current
        if current is None or current.utterance not in utterances:
            return False
        assert current.job is not None  # the current segment is always submitted
        current.job.cancel()
        return True

    def has_work_for(self, context: Context) -> bool:
        return (self.current is not None and self.current.context is context) or any(
            s.context is context for s in self.queue
        )

    def close_if_complete(self, utterance: Utterance) -> None:
        """Tell the utterance's engine stream that no segment will follow
        once ``input.done`` arrived and none is queued or being spoken."""
        if utterance.done_received and not self.has_work_for_utterance(utterance):
            stream = self._engine_streams.pop(utterance, None)
            if stream is not None:
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

    # -- submitting -----------------------------------------------------------
    def _submit(self, item: QueuedSegment) -> None:
        utterance = item.utterance
        start = utterance.audio.first_audio_at
        deadline = (time.monotonic() if start is None else start) + self._audio_ahead_s(utterance)
        # nothing to speak: a segment of no audio, no engine call; else the
        # stream's first segment opens the utterance: its first chunk jumps
        # the engine's queue (StreamRequest.first_audio_priority)
        item.job = segment_job(
            item.segment.engine_text,
            deadline,
            lambda request: self._engine_stream(item).submit(request),
        )

    def _engine_stream(self, item: QueuedSegment) -> EngineStream:
        utterance = item.utterance
        stream = self._engine_streams.get(utterance)
        if stream is None:
            config = utterance.config
            stream = self.env.engine.open_stream(
                StreamRequest(
                    voice=config.voice,
                    language=config.language,
                    speed=config.speed,
                    instructions=config.instructions,
                    seed=config.seed,
                    options=utterance.options,
                    alignment=True,
                    label=f"{self.env.label}/{item.context.id or '-'}",
                    # a whole-sentence message needs the whole sentence decoded
                    # before it can be sent, so only streamed audio is budgeted
                    budget=self.env.budget if config.stream_audio else None,
                )
            )
            self._engine_streams[utterance] = stream
        return stream

    def _audio_ahead_s(self, utterance: Utterance) -> float:
        """Seconds of the utterance's audio that play before a segment
        submitted now: what was sent, plus what the segment being spoken has
        still to send (its length once the engine knows it, else estimated
        from its text).  The engine serves the earliest deadline first, so a
        prefetched segment must not look as urgent as the audio playing now."""
        sent_ms = utterance.audio.sent_ms
        ahead = sent_ms / 1000
        current = self.current
        if current is not None and current.utterance is utterance and current.job is not None:
            segment = current.segment
            total = current.job.stats.audio_seconds
            if total is None:
                total = estimate_seconds(segment.engine_text, utterance.config.speed)
            started = segment.audio.started
            sent_s = (sent_ms - segment.audio.start_ms) / 1000 if started else 0.0
            ahead += max(0.0, total - sent_s)
        return ahead

    # -- the task ---------------------------------------------------------
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
                item = self.segments.start_next()
                try:
                    await self._speak(item)
                finally:
                    self.segments.finish()  # the next may have waited for room
                self.close_if_complete(item.utterance)
                reading = item.utterance.reading
                if item.utterance.done_received and reading is not None:
                    await asyncio.wait({reading})  # its end-of-text check
                # a cancel that arrived while audio.done was going out
                await self._report_cancel(item.context, None)
                await self._send(self.env.host.segment_dequeued(item.context))
        except ConnectionGone:
            self.env.host.connection_lost()

    async def _send(self, messages: list[protocol.ServerMessage]) -> None:
        for message in messages:
            await self.env.out.event(message)

    async def _report_cancel(self, ctx: Context, open_segment: Segment | None) -> None:
        reports = self.env.host.cancelled_audio_ended(
            ctx, open_segment, delivered=not self.env.out.gone
        )
        await self._send(reports)

    def _resampler(self, utterance: Utterance) -> StreamResampler:
        resampler = self._resamplers.get(utterance)
        if resampler is None:
            voice_rate = self.env.voice_rates[utterance.config.voice]
            resampler = StreamResampler(voice_rate, utterance.config.sample_rate)
            self._resamplers[utterance] = resampler
        return resampler

    async def _speak(self, item: QueuedSegment) -> None:
        ctx, utt, segment = item.context, item.utterance, item.segment
        job = item.job
        assert job is not None
        utt.audio.start_segment(segment.audio)  # its audio begins where the utterance is now
        await self._send(segment_events.audio_start(ctx, utt, segment))
        out = _SegmentOut(self.env, item)
        resampler = self._resampler(utt)
        # the delivery pipeline (gateway.delivery), shared with HTTP: the SSML
        # pauses, the job's events with the audio resampled; an engine
        # failure or a bug is logged and classified there
        speaking = SegmentAudio(
            job,
            resampler,
            spoken=segment.spoken,
            where=f"context={ctx.id} sentence={segment.index}",
            logger=self.env.log,
        )
        await out.open()
        if (pause := speaking.pause_before()).size:
            await out.push(pause)
        failure = await self._decode(item, speaking, out)
        if not utt.cancelled and failure is None and (pause := speaking.pause_after()).size:
            await out.push(pause)
        if not utt.cancelled:
            # the next segment of the utterance is queued: keep the
            # resampler's state so the two join seamlessly
            carry = self.has_next_for(utt) and failure is None
            if not carry:
                self._resamplers.pop(utt, None)
            await out.push(np.zeros(0, np.float32) if carry else resampler.flush(), last=True)
            await out.send_whole()
            if failure is None and not utt.cancelled:
                await out.send_words()
        if utt.cancelled:
            # frames after the cancel were dropped by admit: the report
            # follows the last frame that actually went out
            self._resamplers.pop(utt, None)
            await self._report_cancel(ctx, segment)
            return
        utt.audio.finish_segment(segment.audio, utt.config.sample_rate)
        await self._send(segment_events.audio_done(ctx, utt, segment, failure))

    async def _decode(
        self, item: QueuedSegment, speaking: SegmentAudio, out: _SegmentOut
    ) -> GatewayError | None:
        """Speak the job's events until it ends or the utterance is
        cancelled; the segment's failure, if it failed."""
        utt, segment, job = item.utterance, item.segment, speaking.job
        voice_rate = speaking.resampler.in_rate
        budgeted = utt.config.stream_audio
        # this job is the one being sent: it may take a chunk past the
        # session buffer while it holds nothing (the prefetched jobs wait)
        self.env.budget.sending(job)
        try:
            async with contextlib.aclosing(speaking.events()) as events:
                async for event in events:
                    if utt.cancelled:
                        break
                    if isinstance(event, WordTimings):
                        # kept for the cancel report; alignment if asked for
                        mapped = segment.audio.add_words(event.words, segment.spoken_form)
                        await self._send(
                            segment_events.alignment(item.context, utt, segment, mapped)
                        )
                    else:
                        await out.push(event.samples)
                        if budgeted:  # written to the socket: budget freed
                            self.env.budget.release(job, event.native_samples / voice_rate)
                        self.segments.prefetch()  # sending made room in the session buffer
        except ConnectionGone:
            raise  # the pipeline cancelled the job as its generator closed
        except Exception:  # a bug on this side of the pipeline: the segment fails
            speaking.broke()
        finally:
            self._job_ended(utt, job.stats)
            self.env.budget.release(job)
        return _failure(segment, speaking.failure)

    def _job_ended(self, utt: Utterance, stats: SegmentStats) -> None:
        """A segment's engine job ended (finished, failed or cancelled): its figures."""
        utt.audio.account(stats)
        metrics = self.env.metrics
        metrics.sentences.inc()
        if stats.extra.get("acoustic_ms"):
            metrics.acoustic_seconds.observe(stats.extra["acoustic_ms"] / 1000)
        if stats.first_chunk_ms:
            metrics.first_chunk_seconds.observe(stats.first_chunk_ms / 1000)
