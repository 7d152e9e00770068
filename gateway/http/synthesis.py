"""The HTTP sink of the delivery pipeline: a plan's text to encoded audio.

``synthesize`` speaks a ``SpeechPlan`` through the pipeline the WebSocket
uses (``gateway.delivery``: the segment queue submits the next segment
while the current one decodes, ``segment_job`` makes each segment's job;
``SegmentAudio`` gives its pauses and resamples each chunk to the response
rate with one ``StreamResampler`` carried across segments, and classifies a
failure); ``encoded_audio`` turns the samples into the
response format with a ``ContainerEncoder``, in worker threads.

A failed segment ends the audio with the pipeline's ``GatewayError``
(``engine_refused``, or ``internal`` with no exception text for a bug in
the gateway): the response turns it into a JSON error, or cuts a body
already under way short.

Scheduling: an HTTP job's deadline is ``http_deadline_offset_s`` in the
future, so the engine's workers (which serve the earliest due work first)
put live WebSocket streams ahead of it; and no work item runs on more than
the engine's ``max_work_item`` (a long segment is several items, which live
work can come between).  The request's text is read on the state's own
``http_text_reader`` thread, not in the executor the sessions use.

What it must not do: compute model work or encode on the event loop, or
keep synthesizing once its consumer stops reading (closing the generator
cancels the engine jobs).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.audio.containers import ContainerEncoder
from gateway.audio.resample import StreamResampler
from gateway.delivery.queue import SegmentQueue
from gateway.delivery.segment import Audio, SegmentAudio, segment_job
from gateway.engines.base import SynthesisJob, WordTimings
from gateway.errors import ErrorCode, GatewayError
from gateway.http.plan import SpeechPlan
from gateway.state import GatewayState
from gateway.text.frontend import FrontEnd, FrontEndError, SpokenSegment
from gateway.text.stage import (
    EngineTextBudget,
    client_position,
    frontend_options,
    source_words,
)
from gateway.text.whole_text import committed_segments


@dataclass(eq=False)
class _Segment:
    spoken: SpokenSegment
    job: SynthesisJob | None = None


def spoken_segments(state: GatewayState, plan: SpeechPlan) -> list[SpokenSegment]:
    """The request's text cut into segments and read by one front-end.

    The whole text is known, so the front-end reads all of it before any
    audio: malformed SSML is a 400 ``invalid_ssml`` naming the position,
    engine text over ``max_utterance_engine_chars`` once expanded a 400
    ``text_too_long`` (``EngineTextBudget``, the WebSocket's rule)."""
    controls = plan.controls
    frontend = FrontEnd(
        frontend_options(
            input_format=controls.input_format,
            normalize=controls.normalize,
            emoji=controls.emoji,
            pronunciations=controls.pronunciations,
            language=plan.language or plan.voice.language,
            capabilities=state.engine.capabilities,
            lexicon=state.lexicon,
        )
    )
    texts = committed_segments(
        plan.text,
        state.settings.max_segment_chars,
        controls.input_format,
        state.engine.capabilities.markup_tags,
    )
    try:
        spoken = [frontend.process(text) for text in texts]
        tail = frontend.finish()
    except FrontEndError as exc:
        at = client_position(plan.text, texts, exc.position)
        raise GatewayError(
            ErrorCode.INVALID_SSML,
            f"`input` is not valid SSML: {exc.message} (at character {at})",
            param="input",
        ) from None
    if tail is not None:
        spoken.append(tail)
    budget = EngineTextBudget(state.settings.engine_chars_budget)
    if not all(budget.take(s) for s in spoken):
        raise GatewayError(ErrorCode.TEXT_TOO_LONG, f"`input`: {budget.message}", param="input")
    return [s for s in spoken if s.text.strip() or s.pauses]


async def synthesize(
    state: GatewayState,
    plan: SpeechPlan,
    label: str,
    words: list[dict[str, Any]] | None = None,
) -> AsyncGenerator[npt.NDArray[np.float32], None]:
    """Audio of ``plan`` at its output rate, chunk by chunk; raises the
    pipeline's ``GatewayError`` when a segment fails; cancels the engine
    jobs when closed early (disconnect, cancellation).  ``words``: where the
    client's words and their times in the audio go (``plan.word_timestamps``)."""
    offset = state.settings.http_deadline_offset_s
    # the front-end's reading costs up to about a millisecond a segment (a
    # 20,000-character input about 0.3 s): never on the event loop, and
    # on the HTTP API's own thread, never in the executor the WebSocket
    # sessions read their long segments in; malformed SSML is refused
    # before any audio
    loop = asyncio.get_running_loop()
    read = await loop.run_in_executor(state.http_text_reader, spoken_segments, state, plan)
    stream = state.engine.open_stream(plan.stream_request(label))

    def submit(segment: _Segment) -> None:
        deadline = time.monotonic() + offset
        segment.job = segment_job(segment.spoken.text, deadline, stream.submit)

    segments: SegmentQueue[_Segment] = SegmentQueue(submit)
    for spoken in read:
        segments.append(_Segment(spoken))
    resampler = StreamResampler(plan.voice.sample_rate, plan.sample_rate)
    sent = 0  #: samples yielded, at the output rate
    try:
        index = 0
        while segments.waiting:
            queued = segments.start_next()
            job = queued.job
            assert job is not None
            segment = SegmentAudio(
                job, resampler, spoken=queued.spoken, where=f"{label} segment {index}"
            )
            if (pause := segment.pause_before()).size:  # an SSML <break>
                sent += pause.size
                yield pause
            # every WordTimings of the segment (one per work item of a long
            # one) is timed from the segment's start, not from where it comes
            start_ms = sent * 1000 / plan.sample_rate
            async with contextlib.aclosing(segment.events()) as events:
                async for event in events:
                    if isinstance(event, Audio) and event.samples.size:
                        sent += event.samples.size
                        yield event.samples
                    elif isinstance(event, WordTimings) and words is not None:
                        words.extend(
                            {
                                "word": w.text,
                                "start_ms": round(start_ms + w.start_ms),
                                "end_ms": round(start_ms + w.end_ms),
                            }
                            for w in source_words(queued.spoken, event.words)
                        )
            if segment.failure is not None:
                raise segment.failure
            if (pause := segment.pause_after()).size:
                sent += pause.size
                yield pause
            segments.finish()
            state.metrics.sentences.inc()
            index += 1
        tail = resampler.flush()
        if tail.size:
            yield tail
    finally:
        # closed early (a disconnect, a cancelled task): stop every job now,
        # not when the garbage collector finalizes their iterators
        segments.clear()
        stream.cancel()


async def _in_thread(fn: Callable[..., bytes], *args: Any) -> bytes:
    """``fn(*args)`` in a worker thread.  Cancelled meanwhile, it still waits
    for the call to return (the caller closes the encoder next, which must
    not happen under a running ``push``), then re-raises the cancel."""
    call = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        while not call.done():  # an encoder call takes milliseconds
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({call})
        if not call.cancelled():
            call.exception()  # retrieved: the cancel is what the caller hears
        raise


async def encoded_audio(
    state: GatewayState,
    plan: SpeechPlan,
    label: str,
    encoder: ContainerEncoder,
    words: list[dict[str, Any]] | None = None,
) -> AsyncGenerator[bytes, None]:
    """``plan`` spoken and encoded, piece by piece (``words``: ``synthesize``'s)."""
    audio = synthesize(state, plan, label, words)
    try:
        async for samples in audio:
            # MP3 and Opus encoding is real work: never on the event loop
            data = await _in_thread(encoder.push, samples)
            if data:
                yield data
        tail = await _in_thread(encoder.finish)
        if tail:
            yield tail
    finally:
        await audio.aclose()
        encoder.close()
