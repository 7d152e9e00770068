"""OpenAI-compatible ``POST /v1/audio/speech`` and ``POST /v1/audio/speech/batch``.

A request is validated into a ``SpeechPlan`` by the shared validator
(``gateway.session.validation``; voice resolved, format and rate fixed), then
``synthesize`` speaks its text segment by segment on the shared engine,
through the segment pipeline the WebSocket path uses
(``gateway.text.queue``: the next segment is submitted while the current
one decodes), resampling to the response rate with one
``StreamResampler``; ``ContainerEncoder`` turns the samples into the
response format.  Three response modes:

* ``audio`` (OpenAI's default ``stream_format``, or vllm-omni's ``stream:
  true``): a chunked body, each piece sent as soon as it is encoded;
* ``sse``: ``speech.audio.delta`` events with base64 audio, then
  ``speech.audio.done``;
* ``file`` (``stream: false``): one complete file with exact headers.

Scheduling: an HTTP job's deadline is ``http_deadline_offset_s`` in the
future, so the engine's workers (which serve the earliest due work first)
put live WebSocket streams ahead of it.  ``GatewayState.http_admission``
(``max_http_streams``) caps HTTP synthesis separately from the WebSocket's
``max_active_streams``, with the same admission queue in front
(``gateway.flow.admission``): a request waits up to ``admission_deadline_s``
for a slot, then ``503 busy`` with ``Retry-After``; batch items wait as long
as needed.

Disconnects: ``SpeechResponse`` listens for ``http.disconnect`` while it
produces; a disconnect cancels the producer, whose ``finally`` cancels the
engine jobs.  A client that stops reading is treated the same way after
``stall_timeout_s`` (``gateway.http.outbound``: the connection is aborted,
the body ends cut short, the engine stream is cancelled and the slot freed).

What it must not do: compute model work on the event loop, or keep
synthesizing for a client that left.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import msgspec
import numpy as np
import numpy.typing as npt
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from gateway import protocol
from gateway.audio.containers import (
    RESPONSE_FORMATS,
    ContainerEncoder,
    format_support,
    output_rate,
)
from gateway.audio.resample import StreamResampler
from gateway.engines.base import (
    AudioChunk,
    EngineEvent,
    SegmentRequest,
    StreamRequest,
    SynthesisError,
    SynthesisJob,
    VoiceInfo,
)
from gateway.errors import ErrorCode, GatewayError
from gateway.flow.admission import AdmissionGate, Refused, Ticket
from gateway.http.batch_checks import check_batch_inputs
from gateway.http.errors import (
    check_request,
    error_body,
    error_response,
    gateway_state,
    read_body,
)
from gateway.http.outbound import CUT_WAIT_S, GuardedSend, HttpStalled
from gateway.http.security import agent_identity
from gateway.http.voices import resolve_voice
from gateway.protocol import too_deep
from gateway.session.validation import (
    VLLM_ANY,
    VLLM_DEFAULTS,
    check_choice,
    check_instructions,
    check_language,
    check_model,
    check_pronunciations,
    check_sample_rate,
    check_speed,
    check_vllm_fields,
)
from gateway.state import GatewayState
from gateway.text.frontend import FrontEnd, FrontEndError, InputFormat, SpokenSegment
from gateway.text.queue import SegmentQueue, committed_segments
from gateway.text.segmenter import is_speakable
from gateway.text.stage import (
    SilentJob,
    client_position,
    frontend_options,
    pause_ms,
    pause_samples,
)

log = logging.getLogger(__name__)

Mode = Literal["file", "audio", "sse"]

SAMPLE_RATE_HEADER = "X-Sample-Rate"
_SSE_MEDIA_TYPE = "text/event-stream"
_request_ids = itertools.count(1)


class VoiceRef(msgspec.Struct, forbid_unknown_fields=True):
    """OpenAI's voice object form: ``{"id": "alloy"}``."""

    id: str


class SpeechBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    input: str
    voice: str | VoiceRef
    model: str | None = None
    response_format: str = "mp3"
    speed: float = 1.0
    instructions: str | None = None
    stream_format: str | None = None
    stream: bool | None = None
    sample_rate: int | None = None
    language: str | None = None
    # vllm-omni's extension fields: accepted at their defaults; the voice-clone
    # ones go to an engine declaring ``cloning`` (``validation.check_vllm_fields``)
    task_type: str | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    x_vector_only_mode: bool | None = None
    non_streaming_mode: bool | None = None
    max_new_tokens: int | None = None
    initial_codec_chunk_frames: int | None = None
    # the text front-end (``docs/text.md``), as in ``session.config``
    input_format: str | None = None
    normalize: bool | None = None
    emoji: str | None = None
    pronunciations: dict[str, str] | None = None


@dataclass(frozen=True)
class TextControls:
    """How a request's text is read (the front-end's client controls)."""

    input_format: InputFormat = "markdown"
    normalize: bool = True
    emoji: str = "drop"
    pronunciations: Mapping[str, str] = field(default_factory=dict)


def text_controls(body: SpeechBody) -> TextControls:
    input_format = check_choice(
        body.input_format or "markdown", "input_format", get_args(protocol.InputFormat)
    )
    emoji = check_choice(body.emoji or "drop", "emoji", get_args(protocol.EmojiReading))
    pronunciations = check_pronunciations(body.pronunciations or {})
    return TextControls(
        input_format,  # type: ignore[arg-type]  # checked against the Literal's values
        True if body.normalize is None else body.normalize,
        emoji,
        pronunciations,
    )


@dataclass(frozen=True)
class SpeechPlan:
    text: str
    voice: VoiceInfo
    speed: float
    response_format: str
    sample_rate: int
    mode: Mode
    #: the style prompt, for an engine that declares ``instructions``
    instructions: str | None = None
    #: the language asked for (the voice's own tag), None: not given
    language: str | None = None
    #: voice-clone fields for an engine declaring ``cloning``
    options: Mapping[str, object] = field(default_factory=dict)
    #: how the text is read (the front-end)
    controls: TextControls = field(default_factory=TextControls)


# --- validation --------------------------------------------------------------------


def _invalid(message: str, param: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_CONFIG, message, param=param)


def decode_body(data: bytes | dict[str, Any]) -> SpeechBody:
    try:
        if isinstance(data, dict):
            return msgspec.convert(data, SpeechBody)
        return msgspec.json.decode(data, type=SpeechBody)
    except msgspec.ValidationError as exc:
        raise GatewayError(ErrorCode.INVALID_MESSAGE, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise GatewayError(ErrorCode.INVALID_JSON, f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise too_deep() from None


#: formats whose streamed form lacks what a whole-file reader needs: a
#: streamed FLAC's STREAMINFO says "total samples unknown", which libsndfile
#: cannot read, and the openai SDK's ``speech.create`` reads the body whole.
#: Unless a client asks for a stream (``stream_format``, ``stream: true``),
#: these come back as one complete file with exact headers.
WHOLE_BY_DEFAULT: frozenset[str] = frozenset({"flac"})


def response_mode(body: SpeechBody) -> Mode:
    fmt = body.stream_format
    if fmt is not None and fmt not in ("audio", "sse"):
        raise _invalid(f"stream_format must be 'audio' or 'sse', not {fmt!r}", "stream_format")
    if body.stream is False:
        if fmt is not None:
            raise _invalid("`stream: false` and `stream_format` contradict each other", "stream")
        return "file"
    if body.stream is None and fmt is None and body.response_format in WHOLE_BY_DEFAULT:
        return "file"
    if fmt == "sse":
        return "sse"
    return "audio"  # OpenAI streams the body by default; `stream: true` is the same


async def make_plan(request: Request, body: SpeechBody, *, batch: bool = False) -> SpeechPlan:
    """Validate a request body into a plan, or raise ``GatewayError``."""
    state = gateway_state(request)
    settings, engine = state.settings, state.engine
    if batch and (body.stream is not None or body.stream_format is not None):
        raise _invalid(
            "batch items are returned whole: leave out stream and stream_format", "stream"
        )
    mode = response_mode(body)
    if body.model is not None:
        check_model(body.model, engine.name, engine.model_names())
    text = body.input
    if not text.strip():
        raise _invalid("`input` is empty", "input")
    if "\x00" in text:
        raise _invalid("`input` contains a NUL character (U+0000); remove it", "input")
    if len(text) > settings.max_utterance_chars:
        raise GatewayError(
            ErrorCode.TEXT_TOO_LONG,
            f"`input` has {len(text)} characters; the limit is {settings.max_utterance_chars}",
            param="input",
        )
    if not is_speakable(text):
        raise _invalid("`input` has nothing speakable (no letters or digits)", "input")
    check_speed(body.speed)
    controls = text_controls(body)
    instructions = check_instructions(
        body.instructions, engine.name, engine.capabilities.instructions
    )
    given = {
        name: value
        for name in (*VLLM_DEFAULTS, *VLLM_ANY)
        if (value := getattr(body, name, None)) is not None
    }
    options = {
        name: value
        for name, value in check_vllm_fields(given, engine.capabilities.cloning).items()
        if value is not None
    }
    fmt = body.response_format
    if fmt not in RESPONSE_FORMATS:
        raise _invalid(
            f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, not {fmt!r}",
            "response_format",
        )
    support = format_support()
    if not support.available[fmt]:
        raise GatewayError(
            ErrorCode.UNSUPPORTED_OPTION,
            f"response_format {fmt!r} is not available: {support.reasons[fmt]}",
            param="response_format",
        )
    if body.sample_rate is not None:
        check_sample_rate(body.sample_rate)
    try:
        rate = output_rate(fmt, 0, body.sample_rate)
    except ValueError as exc:
        raise GatewayError(ErrorCode.UNSUPPORTED_OPTION, str(exc), param="sample_rate") from None
    name = body.voice.id if isinstance(body.voice, VoiceRef) else body.voice
    voice = await resolve_voice(request, name)
    language = None if body.language is None else check_language(body.language, voice)
    return SpeechPlan(
        text, voice, body.speed, fmt, rate, mode, instructions, language, options, controls
    )


# --- synthesis ---------------------------------------------------------------------


def synthesis_error(exc: SynthesisError) -> GatewayError:
    """A failed segment as the HTTP API reports it: 400 ``engine_refused``
    when the engine refused the request as invalid, 503 ``busy`` (with
    ``Retry-After``) when no engine server could take it now, else 500
    ``internal``."""
    if exc.refused:
        return GatewayError(ErrorCode.ENGINE_REFUSED, str(exc))
    if exc.busy:
        return GatewayError(ErrorCode.BUSY, f"synthesis failed: {exc}")
    return GatewayError(ErrorCode.INTERNAL, f"synthesis failed: {exc}")


@dataclass(eq=False)
class _Segment:
    spoken: SpokenSegment
    job: SynthesisJob | None = None


def spoken_segments(state: GatewayState, plan: SpeechPlan) -> list[SpokenSegment]:
    """The request's text cut into segments and read by one front-end.

    The whole text is known, so the front-end reads all of it before any
    audio: malformed SSML is a 400 ``invalid_ssml`` naming the position."""
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
    texts = committed_segments(plan.text, state.settings.max_segment_chars, controls.input_format)
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
    return [s for s in spoken if s.text.strip() or s.pauses]


async def synthesize(
    state: GatewayState, plan: SpeechPlan, label: str
) -> AsyncGenerator[npt.NDArray[np.float32], None]:
    """Audio of ``plan`` at its output rate, chunk by chunk; cancels the
    engine jobs when closed early (disconnect, cancellation)."""
    engine = state.engine
    offset = state.settings.http_deadline_offset_s
    # the front-end's reading costs up to about a millisecond a segment:
    # never on the event loop; malformed SSML is refused before any audio
    read = await asyncio.to_thread(spoken_segments, state, plan)

    stream = engine.open_stream(
        StreamRequest(
            voice=plan.voice.name,
            language=plan.language,
            speed=plan.speed,
            instructions=plan.instructions,
            options=plan.options,
            alignment=False,
            first_audio_priority=False,  # a WebSocket utterance's first chunk goes first
            label=label,
        )
    )

    def submit(segment: _Segment) -> None:
        text = segment.spoken.text
        if not text.strip():  # only pauses: no engine call
            segment.job = SilentJob()
            return
        segment.job = stream.submit(SegmentRequest(text=text, deadline=time.monotonic() + offset))

    # the next segment is submitted while the current one decodes: its
    # acoustic stage overlaps our decode (gateway.text.queue)
    segments: SegmentQueue[_Segment] = SegmentQueue(submit)
    for spoken in read:
        segments.append(_Segment(spoken))
    voice_rate = plan.voice.sample_rate
    resampler = StreamResampler(voice_rate, plan.sample_rate)
    try:
        while segments.waiting:
            segment = segments.start_next()
            job = segment.job
            assert job is not None
            before, after = pause_ms(segment.spoken)
            pieces: list[AsyncIterator[EngineEvent] | np.ndarray] = [
                pause_samples(before, voice_rate),
                job.__aiter__(),
                pause_samples(after, voice_rate),
            ]
            for piece in pieces:
                if isinstance(piece, np.ndarray):  # SSML <break>: silence made here
                    out = resampler.process(piece) if piece.size else piece
                    if out.size:
                        yield out
                    continue
                async for event in piece:
                    if isinstance(event, AudioChunk):
                        out = resampler.process(event.samples)
                        if out.size:
                            yield out
            segments.finish()
            state.metrics.sentences.inc()
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
    state: GatewayState, plan: SpeechPlan, label: str, encoder: ContainerEncoder
) -> AsyncGenerator[bytes, None]:
    audio = synthesize(state, plan, label)
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


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


async def sse_events(
    state: GatewayState, plan: SpeechPlan, label: str, encoder: ContainerEncoder
) -> AsyncGenerator[bytes, None]:
    audio = encoded_audio(state, plan, label, encoder)
    try:
        async for data in audio:
            yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    except SynthesisError as exc:
        error = synthesis_error(exc)
        yield _sse({"type": "error", **error_body(error)})
        return
    finally:
        await audio.aclose()
    audio_ms = round(encoder.samples * 1000 / plan.sample_rate)
    yield _sse(
        {
            "type": "speech.audio.done",
            # no tokenizer here: input counts characters, output milliseconds
            "usage": {
                "input_tokens": len(plan.text),
                "output_tokens": audio_ms,
                "total_tokens": len(plan.text) + audio_ms,
            },
            "audio_ms": audio_ms,
            "sample_rate": plan.sample_rate,
        }
    )


class SpeechResponse:
    """An ASGI response that produces its body while listening for the
    client going away; on a disconnect the producer is cancelled (and with
    it the engine jobs).  Headers go out with the first body piece, so a
    failure before any audio is still a proper JSON error.  ``whole``
    collects the body first and sends it with a Content-Length."""

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        *,
        media_type: str,
        headers: dict[str, str],
        state: GatewayState,
        whole: bool = False,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.body = body
        self.media_type = media_type
        self.headers = headers
        self.state = state
        self.whole = whole
        self.on_close = on_close
        self.cut = False  #: failed mid-body: the connection was closed

    def _start(self, length: int | None) -> Message:
        headers = [(b"content-type", self.media_type.encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        return {"type": "http.response.start", "status": 200, "headers": headers}

    async def _produce(self, send: Send) -> None:
        try:
            await self._produce_guarded(send)
        except HttpStalled:
            # the client stopped reading: its connection is aborted
            # (gateway.http.outbound); the finally below stops the engine work
            pass
        finally:
            await self.body.aclose()

    async def _produce_guarded(self, send: Send) -> None:
        started = False
        try:
            if self.whole:
                data = b"".join([piece async for piece in self.body])
                await send(self._start(len(data)))
                started = True
                await send({"type": "http.response.body", "body": data, "more_body": False})
                self.state.metrics.bytes_sent.inc(len(data))
                return
            async for piece in self.body:
                if not started:
                    await send(self._start(None))
                    started = True
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                self.state.metrics.bytes_sent.inc(len(piece))
            if not started:
                await send(self._start(None))
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (GatewayError, SynthesisError) as exc:
            error = exc if isinstance(exc, GatewayError) else synthesis_error(exc)
            if started:
                # the status is gone already: cut the body short so the
                # client sees an incomplete response, never a clean end
                log.warning("HTTP speech failed mid-response: %s", error.message)
                if isinstance(send, GuardedSend) and send.cut():
                    self.cut = True
                    return
                raise
            response = error_response(error, self.state)
            await response({"type": "http"}, _never_receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def listen() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return

        guarded = GuardedSend(scope, send, self.state.settings.stall_timeout_s)
        producer = asyncio.create_task(self._produce(guarded))
        listener = asyncio.create_task(listen())
        try:
            await asyncio.wait({producer, listener}, return_when=asyncio.FIRST_COMPLETED)
            if not producer.done():
                log.info("HTTP client went away: speech work stopped")
                producer.cancel()
            elif self.cut:
                # the connection is closing: return once uvicorn saw it go
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CUT_WAIT_S):
                        await asyncio.shield(listener)
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            with contextlib.suppress(asyncio.CancelledError):
                await producer
        finally:
            if not producer.done():
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)
            if self.on_close is not None:
                self.on_close()


async def _never_receive() -> Message:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


# --- routes ------------------------------------------------------------------------


def _headers(plan: SpeechPlan) -> dict[str, str]:
    return {SAMPLE_RATE_HEADER: str(plan.sample_rate), "Cache-Control": "no-store"}


async def speech(request: Request) -> Response | SpeechResponse:
    state = gateway_state(request)
    if (refused := check_request(request)) is not None:
        return error_response(refused, state)
    try:
        raw = await read_body(request, state.settings.max_message_bytes)
        plan = await make_plan(request, decode_body(raw))
    except GatewayError as exc:
        return error_response(exc, state)
    slots = state.http_admission
    try:  # the wait counts in the client's time to first audio
        ticket = await slots.acquire(http_client(request, state))
    except Refused as no_slot:
        return error_response(http_busy(slots, no_slot.ticket), state)
    label = f"http-{next(_request_ids)}"
    try:
        encoder = ContainerEncoder(
            plan.response_format, plan.sample_rate, stream=plan.mode != "file"
        )
    except Exception:
        slots.release(ticket)  # the response that would release it never starts
        log.exception("creating the %s encoder failed", plan.response_format)
        return error_response(
            GatewayError(ErrorCode.INTERNAL, "the audio encoder could not be created"), state
        )
    body = (
        sse_events(state, plan, label, encoder)
        if plan.mode == "sse"
        else encoded_audio(state, plan, label, encoder)
    )
    headers = _headers(plan)
    if plan.response_format == "pcm":
        headers["X-Audio-Encoding"] = "pcm_s16le"
    return SpeechResponse(
        body,
        media_type=_SSE_MEDIA_TYPE if plan.mode == "sse" else encoder.media_type,
        headers=headers,
        state=state,
        whole=plan.mode == "file",
        on_close=lambda: slots.release(ticket),
    )


async def _batch_item(
    request: Request,
    index: int,
    fields: dict[str, Any],
    limit: asyncio.Semaphore,
) -> dict[str, Any]:
    state = gateway_state(request)
    slots = state.http_admission
    try:
        plan = await make_plan(request, decode_body(fields), batch=True)
        # every field kept (the style prompt, language and text controls too)
        plan = dataclasses.replace(plan, mode="file")
        async with limit:
            try:  # batch items wait as long as needed (the queue's length still bounds)
                ticket = await slots.acquire(http_client(request, state), deadline_s=math.inf)
            except Refused as refused:
                raise http_busy(slots, refused.ticket) from None
            try:
                encoder = ContainerEncoder(plan.response_format, plan.sample_rate, stream=False)
                label = f"http-batch-{next(_request_ids)}"
                audio = encoded_audio(state, plan, label, encoder)
                try:
                    data = b"".join([piece async for piece in audio])
                finally:
                    await audio.aclose()
            finally:
                slots.release(ticket)
    except GatewayError as exc:
        state.metrics.errors.labels(code=str(exc.code)).inc()
        return {"index": index, "status": "error", **error_body(exc)}
    except SynthesisError as exc:
        error = synthesis_error(exc)
        state.metrics.errors.labels(code=str(error.code)).inc()
        return {"index": index, "status": "error", **error_body(error)}
    return {
        "index": index,
        "status": "ok",
        "media_type": encoder.media_type,
        "response_format": plan.response_format,
        "sample_rate": plan.sample_rate,
        "voice": plan.voice.name,
        "audio_ms": round(encoder.samples * 1000 / plan.sample_rate, 1),
        "audio": base64.b64encode(data).decode(),
    }


def _batch_items(request: Request, raw: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    settings = gateway_state(request).settings
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise GatewayError(ErrorCode.INVALID_JSON, f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise too_deep() from None
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise GatewayError(
            ErrorCode.INVALID_MESSAGE,
            "the body must be an object with an `items` array (and shared defaults)",
            param="items",
        )
    items: list[Any] = doc.pop("items")
    if not items:
        raise _invalid("`items` is empty", "items")
    if len(items) > settings.max_batch_items:
        raise _invalid(
            f"{len(items)} items; a batch holds at most {settings.max_batch_items}", "items"
        )
    check_batch_inputs(items, doc)
    total = sum(len(i.get("input", "")) for i in items if isinstance(i, dict))
    if total > settings.max_batch_chars:
        raise GatewayError(
            ErrorCode.TEXT_TOO_LONG,
            f"the batch has {total} input characters; the limit is {settings.max_batch_chars}",
            param="items",
        )
    return items, doc


async def speech_batch(request: Request) -> Response | SpeechResponse:
    state = gateway_state(request)
    if (refused := check_request(request)) is not None:
        return error_response(refused, state)
    limit_bytes = max(state.settings.max_message_bytes, 8 * state.settings.max_batch_chars)
    try:
        items, defaults = _batch_items(request, await read_body(request, limit_bytes))
    except GatewayError as exc:
        return error_response(exc, state)
    concurrency = asyncio.Semaphore(state.settings.batch_concurrency)

    async def run(index: int, item: Any) -> dict[str, Any]:
        if not isinstance(item, dict):
            error = GatewayError(ErrorCode.INVALID_MESSAGE, "a batch item must be an object")
            return {"index": index, "status": "error", **error_body(error)}
        return await _batch_item(request, index, {**defaults, **item}, concurrency)

    async def body() -> AsyncGenerator[bytes, None]:
        results = await asyncio.gather(*(run(i, item) for i, item in enumerate(items)))
        ok = sum(1 for r in results if r["status"] == "ok")
        yield json.dumps(
            {"object": "list", "succeeded": ok, "failed": len(results) - ok, "data": results}
        ).encode()

    return SpeechResponse(
        body(), media_type="application/json", headers={}, state=state, whole=True
    )


def http_client(request: Request, state: GatewayState) -> str:
    """Whom admission's fairness counts a request as: its agent key, else its address."""
    agent = agent_identity(request, state)
    return agent or (request.client.host if request.client else "unknown")


def http_busy(slots: AdmissionGate, ticket: Ticket) -> GatewayError:
    """The ``503 busy`` (with ``Retry-After``) of a request refused a slot."""
    queue = slots.queue
    if ticket.refusal == "draining":
        why = "the server is draining (shutting down); send it to another server"
    elif ticket.refusal == "deadline":
        why = (
            f"no slot came free within {queue.deadline_s:g} s (all {queue.limit} HTTP"
            " speech slots in use); retry after Retry-After"
        )
    else:
        why = (
            f"all {queue.limit} HTTP speech slots are in use and the admission queue is full;"
            " retry after Retry-After"
        )
    return GatewayError(ErrorCode.BUSY, why, retry_after_s=ticket.retry_after_s)


def speech_routes() -> list[Route]:
    return [
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/audio/speech/batch", speech_batch, methods=["POST"]),
    ]


def log_format_support() -> None:
    support = format_support()
    log.info(
        "HTTP formats with libsndfile %s: %s",
        support.libsndfile_version,
        ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in support.available.items()),
    )
