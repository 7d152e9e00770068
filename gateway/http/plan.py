"""The request schema of ``POST /v1/audio/speech`` and the plan it becomes.

A body is decoded into a ``SpeechBody`` (OpenAI's fields plus vllm-omni's
extensions) and validated into a ``SpeechPlan`` by ``make_plan``, the one
place a plan is built (single requests and batch items alike): the shared
validator (``gateway.session.validation``) checks each field, the voice is
resolved (aliases, uploaded voices), the format and rate are fixed.
``SpeechPlan.stream_request`` is what the engine is asked for.

A mistake in the text is ``invalid_message`` (``param: input``), as on the
WebSocket; ``invalid_config`` is for configuration fields only.

Pure but for the voice lookup (``resolve_voice`` may read the voice store).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, get_args

import msgspec
from starlette.requests import Request

from gateway import protocol
from gateway.audio.containers import RESPONSE_FORMATS, format_support, output_rate
from gateway.engines.base import StreamRequest, VoiceInfo
from gateway.errors import ErrorCode, GatewayError
from gateway.http.compat import HttpCompat, Mode, default_format
from gateway.http.compat import response_mode as compat_mode
from gateway.http.errors import gateway_state
from gateway.http.voices import resolve_voice
from gateway.protocol import SampleRate, Speed, too_deep
from gateway.session.validation import (
    VLLM_FIELDS,
    check_choice,
    check_input_text,
    check_instructions,
    check_language,
    check_model,
    check_pronunciations,
    check_sample_rate,
    check_seed,
    check_speed,
    check_speed_honoured,
    check_vllm_fields,
    invalid_config,
    named_fields,
    references_to_ref_audio,
    unknown_fields,
)
from gateway.text.frontend import InputFormat
from gateway.voices.catalog import DEFAULT_VOICE_NAME

_any_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


class VoiceRef(msgspec.Struct):
    """OpenAI's voice object form: ``{"id": "alloy"}`` (other keys ignored,
    as vllm-omni 0.30 does)."""

    id: str


class SpeechBody(msgspec.Struct, kw_only=True):
    """Every field of OpenAI's speech request and of vllm-omni 0.30's
    (``OpenAICreateSpeechRequest``); other keys are ignored and named in
    ``X-Ignored-Fields`` (``decode_request``)."""

    input: str
    #: None or ``"default"``: the engine's default voice
    voice: str | VoiceRef | None = None
    speaker: str | VoiceRef | None = None  #: vllm-omni's alias of ``voice``
    model: str | None = None
    #: None: the ``http_compat`` camp's default (``gateway.http.compat``)
    response_format: str | None = None
    # the protocol's bounded types: out of range, msgspec words it as the
    # WebSocket's decoder does
    speed: Speed = 1.0
    instructions: str | None = None
    stream_format: str | None = None
    stream: bool | None = None
    sample_rate: SampleRate | None = None
    language: str | None = None
    seed: int | None = None
    word_timestamps: bool = False
    # vllm-omni's model fields (``validation.check_vllm_fields`` says how each
    # is treated): the voice-clone ones go to an engine declaring ``cloning``
    task_type: str | None = None
    ref_audio: str | list[str] | None = None
    ref_text: str | None = None
    ref_audio_2: str | None = None
    x_vector_only_mode: bool | None = None
    #: a vector or a list of vectors (``validation._check_embedding``)
    speaker_embedding: list[Any] | None = None
    non_streaming_mode: bool | None = None
    max_new_tokens: int | None = None
    initial_codec_chunk_frames: int | None = None
    ambient_sound: str | None = None
    duration_seconds: Annotated[float, msgspec.Meta(ge=0)] | None = None
    extra_params: dict[str, Any] | None = None
    # the text front-end (``docs/text.md``), as in ``session.config``
    input_format: str | None = None
    normalize: bool | None = None
    emoji: str | None = None
    pronunciations: dict[str, str] | None = None


#: the keys a speech body may have (``references`` is read into ``ref_audio``
#: and ``ref_text`` first)
BODY_FIELDS: frozenset[str] = frozenset({*SpeechBody.__struct_fields__, "references"})

#: the response header naming the body's ignored keys (a batch's by path)
IGNORED_FIELDS_HEADER = "X-Ignored-Fields"


def ignored_fields_header(names: list[str]) -> str:
    """``X-Ignored-Fields``'s value: the names as JSON strings (any key fits a
    header, escaped to ASCII), comma-separated, bounded by ``named_fields``."""
    return ", ".join(json.dumps(n) for n in named_fields(names))


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
    #: the sampling seed, for an engine that declares ``seed``
    seed: int | None = None
    #: vllm-omni's ``word_timestamps``: the words' timings in ``X-Word-Timestamps``
    word_timestamps: bool = False

    def stream_request(self, label: str) -> StreamRequest:
        """The engine stream this plan is spoken on."""
        return StreamRequest(
            voice=self.voice.name,
            language=self.language,
            speed=self.speed,
            instructions=self.instructions,
            seed=self.seed,
            options=self.options,
            alignment=self.word_timestamps,
            first_audio_priority=False,  # a WebSocket utterance's first chunk goes first
            label=label,
        )


#: the top-level field a msgspec validation message names (`` - at `$.speed` ``)
_FIELD_PATH = re.compile(r"- at `\$\.([A-Za-z_]+)")


def _field_error(message: str) -> GatewayError:
    """msgspec's message for a bad field, kept as it is (the WebSocket's
    decoder words the same mistake the same way): a configuration field's
    is ``invalid_config``, the text's (``input``) or the body's shape
    (an unknown field) ``invalid_message``."""
    match = _FIELD_PATH.search(message)
    name = match.group(1) if match else None
    if name is None or name == "input":
        return GatewayError(ErrorCode.INVALID_MESSAGE, message, param=name)
    return invalid_config(message, name)


def decode_body(data: bytes | dict[str, Any]) -> SpeechBody:
    """The body (a batch item's fields), its unknown keys ignored."""
    return decode_request(data)[0]


def decode_request(data: bytes | dict[str, Any]) -> tuple[SpeechBody, list[str]]:
    """The body and the keys it has that no field of it names (ignored,
    then named in ``X-Ignored-Fields``), or ``GatewayError``."""
    try:
        raw = data if isinstance(data, dict) else _any_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise GatewayError(ErrorCode.INVALID_JSON, f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise too_deep() from None
    if not isinstance(raw, dict):
        raise GatewayError(
            ErrorCode.INVALID_MESSAGE,
            f"the body must be a JSON object, got {type(raw).__name__}",
        )
    raw = references_to_ref_audio(raw)
    try:
        body = msgspec.convert(raw, SpeechBody)
    except msgspec.ValidationError as exc:
        raise _field_error(str(exc)) from None
    except RecursionError:
        raise too_deep() from None
    return body, unknown_fields(list(raw), BODY_FIELDS)


def response_mode(body: SpeechBody, compat: HttpCompat, *, batch: bool = False) -> Mode:
    """How the audio goes back (``gateway.http.compat``): a batch item is
    always a whole file."""
    fmt = body.stream_format
    if batch:
        if body.stream is not None or fmt is not None:
            raise invalid_config(
                "batch items are returned whole: leave out stream and stream_format", "stream"
            )
        return "file"
    if body.word_timestamps and body.stream is None and fmt is None:
        return "file"  # the timings ride the whole file's headers (vllm-omni 0.30)
    mode = compat_mode(body.stream, fmt, body.response_format or default_format(compat), compat)
    if mode is None:
        raise invalid_config(
            f"stream_format must be 'audio' or 'sse', not {fmt!r}", "stream_format"
        )
    return mode


def _clone_options(body: SpeechBody, cloning: bool) -> dict[str, object]:
    given = {
        name: value for name in VLLM_FIELDS if (value := getattr(body, name, None)) is not None
    }
    return {
        name: value
        for name, value in check_vllm_fields(given, cloning).items()
        if value is not None
    }


def _output_rate(body: SpeechBody, fmt: str) -> int:
    if fmt not in RESPONSE_FORMATS:
        raise invalid_config(
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
        return output_rate(fmt, 0, body.sample_rate)
    except ValueError as exc:
        raise GatewayError(ErrorCode.UNSUPPORTED_OPTION, str(exc), param="sample_rate") from None


async def make_plan(request: Request, body: SpeechBody, *, batch: bool = False) -> SpeechPlan:
    """Validate a request body (or a batch item, ``batch``) into a plan, or
    raise ``GatewayError``."""
    state = gateway_state(request)
    engine = state.engine
    compat = state.settings.http_compat
    mode = response_mode(body, compat, batch=batch)
    response_format = body.response_format or default_format(compat)
    if body.model is not None:
        check_model(body.model, engine.name, engine.model_names())
    text = check_input_text(body.input, state.settings.max_utterance_chars)
    check_speed(body.speed)
    check_speed_honoured(body.speed, engine.name, engine.capabilities.speed)
    controls = text_controls(body)
    instructions = check_instructions(
        body.instructions, engine.name, engine.capabilities.instructions
    )
    options = _clone_options(body, engine.capabilities.cloning)
    rate = _output_rate(body, response_format)
    seed = check_seed(body.seed, engine.name, engine.capabilities.seed)
    if body.word_timestamps:
        if batch:
            raise invalid_config(
                "`word_timestamps` rides a response header: a batch item has none",
                "word_timestamps",
            )
        check_word_timestamps(mode, engine.capabilities.alignment)
    voice = await resolve_voice(request, _voice_name(body))
    language = None if body.language is None else check_language(body.language, voice)
    return SpeechPlan(
        text=text,
        voice=voice,
        speed=body.speed,
        response_format=response_format,
        sample_rate=rate,
        mode=mode,
        instructions=instructions,
        language=language,
        options=options,
        controls=controls,
        seed=seed,
        word_timestamps=body.word_timestamps,
    )


def _voice_name(body: SpeechBody) -> str:
    """``voice`` or its alias ``speaker`` (a name or ``{"id": ...}``); none
    given is the default voice (vllm-omni 0.30's ``"default"``)."""
    voice, speaker = (v.id if isinstance(v, VoiceRef) else v for v in (body.voice, body.speaker))
    if (
        voice is not None
        and speaker is not None
        and voice.strip().casefold() != speaker.strip().casefold()
    ):
        raise invalid_config(
            f"`voice` ({voice!r}) and its alias `speaker` ({speaker!r}) differ; send one of them",
            "voice",
        )
    name = voice if voice is not None else speaker
    return DEFAULT_VOICE_NAME if name is None or not name.strip() else name


def check_word_timestamps(mode: Mode, alignment: bool) -> None:
    """vllm-omni 0.30's ``word_timestamps`` over HTTP: a whole file's words
    in a header, from an engine that gives word timings."""
    if mode != "file":
        raise invalid_config(
            "`word_timestamps: true` needs a whole file (`stream: false`); for streamed"
            " audio use the WebSocket's `word_timestamps` or `timestamps`",
            "word_timestamps",
        )
    if not alignment:
        raise GatewayError(
            ErrorCode.UNSUPPORTED_OPTION,
            "`word_timestamps` needs word timings, which this engine does not give",
            param="word_timestamps",
        )
