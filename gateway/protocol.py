"""Typed messages of the streaming protocol on ``/v1/audio/speech/stream``.

Every JSON message is a msgspec ``Struct`` tagged by its ``type`` field; there
is one union and one reusable decoder per direction.  ``docs/protocol.md`` is
the human side of this contract: the two change together, and a test
round-trips every message class found here.

Compatibility policy (see the docs): within a major ``PROTOCOL_VERSION`` the
gateway only adds messages and optional fields; clients ignore what they do
not know.  A major bump changes a documented meaning (2.0.0: ``session.close``
finishes what was flushed before it closes).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from gateway.errors import ErrorCode, GatewayError

PROTOCOL_VERSION = "2.2.0"

Encoding = Literal["pcm_s16le", "pcm_f32le", "mulaw", "alaw"]
ResponseFormat = Literal["wav", "pcm"]
Granularity = Literal["auto", "sentence", "clause", "none"]
FlowControl = Literal["none", "ack", "realtime"]
Framing = Literal["raw", "tagged"]
PositionSource = Literal["played_ms", "estimate", "sent_ms"]
#: how the client's text is read (``gateway.text.frontend``); since 1.3.0
InputFormat = Literal["markdown", "plain", "ssml"]
EmojiReading = Literal["drop", "name"]

Speed = Annotated[float, Meta(ge=0.25, le=4.0)]
SampleRate = Annotated[int, Meta(ge=8000, le=48000)]
FrameMs = Annotated[int, Meta(ge=10, le=500)]
LeadMs = Annotated[int, Meta(ge=100)]
NonNegativeMs = Annotated[float, Meta(ge=0)]


class _Message(msgspec.Struct, tag_field="type", omit_defaults=False):
    pass


# --------------------------------------------------------------------------
# client -> server
# --------------------------------------------------------------------------


class SessionConfig(_Message, tag="session.config", kw_only=True):
    """Fields left out keep their current value (defaults on the first config).

    A field of no version of this protocol nor of vllm-omni's is ignored and
    named in a ``warning`` (``unknown_fields``; before 2.0.0 it was refused)."""

    voice: str | UnsetType | None = UNSET
    speaker: str | UnsetType | None = UNSET  #: vllm-omni's alias of ``voice``
    language: str | UnsetType | None = UNSET
    speed: Speed | UnsetType | None = UNSET
    response_format: ResponseFormat | UnsetType | None = UNSET
    stream_audio: bool | UnsetType | None = UNSET
    encoding: Encoding | UnsetType | None = UNSET
    sample_rate: SampleRate | UnsetType | None = UNSET
    frame_ms: FrameMs | UnsetType | None = UNSET
    split_granularity: Granularity | UnsetType | None = UNSET
    flow_control: FlowControl | UnsetType | None = UNSET
    max_lead_ms: LeadMs | UnsetType | None = UNSET
    timestamps: bool | UnsetType | None = UNSET
    framing: Framing | UnsetType | None = UNSET
    model: str | UnsetType | None = UNSET
    # vllm-omni 0.30's fields (``gateway.session.validation.VLLM_OMNI_FIELDS``
    # says how each is treated)
    task_type: str | UnsetType | None = UNSET
    instructions: str | UnsetType | None = UNSET
    ref_audio: str | UnsetType | None = UNSET
    ref_text: str | UnsetType | None = UNSET
    x_vector_only_mode: bool | UnsetType | None = UNSET
    speaker_embedding: Any | UnsetType = UNSET
    max_new_tokens: int | UnsetType | None = UNSET
    initial_codec_chunk_frames: int | UnsetType | None = UNSET
    non_streaming_mode: bool | UnsetType | None = UNSET
    word_timestamps: bool | UnsetType | None = UNSET
    #: reproducible sampling on an engine declaring ``seed`` (since 2.0.0)
    seed: int | UnsetType | None = UNSET
    # the text front-end (since 1.3.0; ``docs/text.md``)
    input_format: InputFormat | UnsetType | None = UNSET
    normalize: bool | UnsetType | None = UNSET
    emoji: EmojiReading | UnsetType | None = UNSET
    #: word or phrase -> the text spoken instead; replaces the session's map
    pronunciations: dict[str, str] | UnsetType | None = UNSET
    #: debugging: ``audio.start`` carries ``engine_text``, what the engine read
    debug_engine_text: bool | UnsetType | None = UNSET


class InputText(_Message, tag="input.text", kw_only=True):
    text: str
    context_id: str | None = None


class InputFlush(_Message, tag="input.flush", kw_only=True):
    context_id: str | None = None


class InputDone(_Message, tag="input.done", kw_only=True):
    context_id: str | None = None


class Cancel(_Message, tag="cancel", kw_only=True):
    context_id: str | None = None  #: ``"*"`` cancels every context


class Playback(_Message, tag="playback", kw_only=True):
    played_ms: NonNegativeMs
    context_id: str | None = None


class Ping(_Message, tag="ping", kw_only=True):
    id: str | int | None = None


class SessionClose(_Message, tag="session.close"):
    """End the session politely (since 2.0.0): what was flushed is spoken,
    then the close; ``cancel`` first to stop at once."""


class ReceivedMessages(msgspec.Struct, kw_only=True):
    """Binary audio messages a client received in one context before its
    connection dropped (``session.resume``)."""

    #: the context (null: the default context; under ``raw`` framing every
    #: binary message counts under null)
    context_id: str | None
    #: how many: the last sequence number received + 1 (tagged framing)
    messages: Annotated[int, Meta(ge=0)]


class SessionResume(_Message, tag="session.resume", kw_only=True):
    """Take back a session whose connection dropped (since 2.1.0): the first
    client message of a new connection."""

    resume_token: str
    received: list[ReceivedMessages] = msgspec.field(default_factory=list)
    #: JSON messages received on the dropped connection after its
    #: ``session.created`` (and ``session.resumed``); null: not counted
    events: Annotated[int, Meta(ge=0)] | None = None


#: a client's id for a ``voice.*`` request, echoed in its result or error
RequestId = str | int | None


class VoiceList(_Message, tag="voice.list", kw_only=True):
    request_id: RequestId = None


class VoiceAdd(_Message, tag="voice.add", kw_only=True):
    """Upload reference audio; the same validation as ``POST /v1/audio/voices``."""

    name: str
    audio: str  #: base64, or a ``data:<type>;base64,`` URL
    consent: bool | str
    ref_text: str = ""
    description: str = ""
    request_id: RequestId = None


class VoiceRemove(_Message, tag="voice.remove", kw_only=True):
    name: str
    request_id: RequestId = None


ClientMessage = (
    SessionConfig
    | InputText
    | InputFlush
    | InputDone
    | Cancel
    | Playback
    | Ping
    | SessionClose
    | VoiceList
    | VoiceAdd
    | VoiceRemove
    | SessionResume
)
CLIENT_MESSAGES: tuple[type[_Message], ...] = (
    SessionConfig,
    InputText,
    InputFlush,
    InputDone,
    Cancel,
    Playback,
    Ping,
    SessionClose,
    VoiceList,
    VoiceAdd,
    VoiceRemove,
    SessionResume,
)

# --------------------------------------------------------------------------
# server -> client
# --------------------------------------------------------------------------


class VoiceDescription(msgspec.Struct, kw_only=True):
    name: str
    language: str
    language_name: str
    sample_rate: int
    quality: str
    streaming: bool


class EngineCapabilities(msgspec.Struct, kw_only=True):
    """What the session's engine can do (``Engine.capabilities``); since 1.1.0."""

    sample_rates: list[int]  #: native rates of the voices, Hz
    alignment: bool  #: word timings (``timestamps``) are available
    cloning: bool  #: voices can be cloned from a recording (``voice.add``)
    instructions: bool  #: a style prompt (``instructions``) is honoured
    languages: list[str]  #: BCP-47 tags
    #: deprecated (docs/protocol.md): the engine's declared ``input``, sent as
    #: it is; the gateway segments the text for every engine either way
    input: Literal["segments", "text_stream"]
    max_concurrency: int  #: utterances served well at once; 0: no own limit
    typical_first_chunk_ms: float  #: engine time to a first chunk, typical, alone
    #: the engine reads numbers and symbols itself: the front-end strips
    #: Markdown and emoji only (since 1.3.0)
    normalizes_text: bool = False
    #: a ``seed`` makes its sampled output reproducible (since 2.0.0)
    seed: bool = False


class Limits(msgspec.Struct, kw_only=True):
    max_message_bytes: int
    max_input_text_bytes: int
    max_utterance_chars: int
    max_contexts: int
    max_buffered_ms: int
    config_timeout_s: float
    idle_timeout_s: float
    stall_timeout_s: float
    #: bounded work (additive, unreleased): engine text per utterance once
    #: expanded, the longest client segment, a pronunciation's longest text,
    #: and the engine's work item (``max_work_item`` in ``work_item_unit``)
    max_utterance_engine_chars: int | None = None
    max_segment_chars: int | None = None
    max_pronunciation_chars: int | None = None
    max_work_item: int | None = None
    work_item_unit: str | None = None


class EffectiveConfig(msgspec.Struct, kw_only=True):
    """The values in force after a ``session.config`` (nothing left unset)."""

    voice: str
    language: str
    speed: float
    response_format: ResponseFormat
    stream_audio: bool
    encoding: Encoding
    sample_rate: int
    frame_ms: int
    frame_samples: int  #: nominal samples in one frame at ``sample_rate``
    split_granularity: Granularity
    flow_control: FlowControl
    max_lead_ms: int
    timestamps: bool
    framing: Framing
    model: str
    #: the style prompt passed to an engine that declares ``instructions``
    #: (since 1.2.0; null: none)
    instructions: str | None = None
    #: the text front-end (since 1.3.0)
    input_format: InputFormat = "markdown"
    normalize: bool = True
    emoji: EmojiReading = "drop"
    pronunciations: dict[str, str] = msgspec.field(default_factory=dict)
    debug_engine_text: bool = False
    #: vllm-omni's ``word_timestamps``: audio as JSON ``audio.chunk`` events
    #: with the words' timings (since 2.0.0)
    word_timestamps: bool = False
    #: the sampling seed in force (since 2.0.0; null: none)
    seed: int | None = None


class SessionCreated(_Message, tag="session.created", kw_only=True):
    session_id: str
    protocol_version: str
    engine: str
    voices: list[VoiceDescription]
    defaults: EffectiveConfig
    limits: Limits
    #: since 1.1.0 (absent from older servers)
    capabilities: EngineCapabilities | None = None
    #: the single-use credential of ``session.resume`` (since 2.1.0; a new
    #: one in every ``session.created``)
    resume_token: str | None = None
    #: how long a dropped connection's session waits for ``session.resume``
    resume_window_s: float | None = None


class ResumedContext(msgspec.Struct, kw_only=True):
    """One context of a resumed session (``session.resumed``)."""

    context_id: str | None
    #: characters of the open utterance's text the server holds (every
    #: ``input.text`` it accepted); the client re-sends what follows them
    text_chars: int
    #: the sequence number of the first binary message sent again or next
    #: (tagged framing; under raw framing the count of binary messages sent
    #: before it, for context null)
    next_sequence: int


class SessionResumed(_Message, tag="session.resumed", kw_only=True):
    """The session is back (since 2.1.0): after the new ``session.created``;
    the messages the client did not get follow, then live ones."""

    session_id: str
    contexts: list[ResumedContext]
    #: messages (events and binary) sent again after this one
    replayed_messages: int


class SessionUpdated(_Message, tag="session.updated", kw_only=True):
    config: EffectiveConfig
    limits: Limits


class AudioStart(_Message, tag="audio.start", kw_only=True):
    context_id: str | None
    utterance_index: int
    sentence_index: int
    sentence_text: str
    format: ResponseFormat
    encoding: Encoding
    sample_rate: int
    context_number: int = 0  #: the u16 in tagged frame headers
    #: what the engine read for this sentence, only with ``debug_engine_text``
    #: (since 1.3.0; ``""``: nothing to speak)
    engine_text: str | None = None


class WordTimestamp(msgspec.Struct, kw_only=True):
    word: str
    start_ms: float  #: from the start of the utterance's audio
    end_ms: float
    #: the word's characters ``[char_start, char_end)`` in the utterance's
    #: client text (every ``input.text`` of it joined); since 1.3.0
    char_start: int | None = None
    char_end: int | None = None


class ChunkWord(msgspec.Struct, kw_only=True):
    """A word of an ``audio.chunk``'s ``timestamps`` (vllm-omni's shape)."""

    word: str
    start_ms: float  #: from the start of the sentence's audio
    end_ms: float


class AudioChunk(_Message, tag="audio.chunk", kw_only=True):
    """vllm-omni's JSON audio frame, sent instead of binary frames under
    ``word_timestamps: true`` (since 2.0.0).  A sentence's last chunk has
    no audio (``audio_b64: ""``) and carries its words in ``timestamps``;
    the others carry ``timestamps: null``."""

    utterance_index: int
    sentence_index: int
    chunk_id: int  #: from 0 in each sentence
    chunk_start_ms: int  #: from the start of the sentence's audio
    chunk_end_ms: int
    sample_rate: int
    audio_b64: str  #: the frame's samples in the session's ``encoding``, base64
    #: the sentence's words (last chunk); ``[]``: none; null: not this chunk
    timestamps: list[ChunkWord] | None = None
    context_id: str | None = None


class WarningEvent(_Message, tag="warning", kw_only=True):
    """Something in a client message was ignored; never fatal (since 2.0.0)."""

    code: Literal["unknown_fields"]
    message: str
    #: the ignored fields, in the order they came
    fields: list[str] = msgspec.field(default_factory=list)


class Alignment(_Message, tag="alignment", kw_only=True):
    context_id: str | None
    utterance_index: int
    sentence_index: int
    words: list[WordTimestamp]


class AudioDone(_Message, tag="audio.done", kw_only=True):
    context_id: str | None
    utterance_index: int
    sentence_index: int
    total_bytes: int
    audio_ms: float
    error: bool = False
    cancelled: bool = False


class AudioCancelled(_Message, tag="audio.cancelled", kw_only=True):
    context_id: str | None
    utterance_index: int
    sent_ms: float
    played_ms: float
    position_source: PositionSource
    spoken_text: str
    unspoken_text: str


class UtteranceMetrics(msgspec.Struct, kw_only=True):
    queue_ms: float  #: first segment submitted to the engine until its acoustic work began
    #: the first segment became speakable (boundary, eager, flush) until the
    #: first audio byte was sent
    first_audio_ms: float | None
    audio_ms: float  #: audio duration sent
    compute_ms: float  #: engine time (acoustic + decode)
    compute_rtf: float  #: compute_ms / audio_ms
    sentences: int
    #: time its first committed segment waited at the door (protocol
    #: 1.3); part of ``first_audio_ms``
    admission_wait_ms: float = 0.0


class SessionDone(_Message, tag="session.done", kw_only=True):
    context_id: str | None
    utterance_index: int
    total_sentences: int
    cancelled: bool = False
    metrics: UtteranceMetrics | None = None


class Pong(_Message, tag="pong", kw_only=True):
    id: str | int | None = None


class VoiceListResult(_Message, tag="voice.list.result", kw_only=True):
    request_id: RequestId = None
    #: the objects of ``GET /v1/audio/voices``'s ``data``: builtin, alias, uploaded
    voices: list[dict[str, Any]]


class VoiceAddResult(_Message, tag="voice.add.result", kw_only=True):
    request_id: RequestId = None
    voice: dict[str, Any]  #: as ``GET /v1/audio/voices`` lists it in ``data`` (``type: uploaded``)


class VoiceRemoveResult(_Message, tag="voice.remove.result", kw_only=True):
    request_id: RequestId = None
    name: str
    id: str  #: the removed voice's id
    deleted: bool = True


class UnspokenText(msgspec.Struct, kw_only=True):
    """What a context's client sent and did not hear, on the
    ``resume_expired`` of a session that ended unresumed (since 2.2.0)."""

    context_id: str | None
    #: the text, from the first word not heard (as ``audio.cancelled``'s)
    unspoken_text: str
    #: cut to the report's bound: more was not heard than this
    truncated: bool = False


class Error(_Message, tag="error", kw_only=True):
    code: ErrorCode
    message: str
    fatal: bool = False
    context_id: str | None = None
    #: vllm-omni's fields on a mid-sentence failure
    partial_audio: bool | None = None
    action: str | None = None
    #: the ``request_id`` of the ``voice.*`` request that was refused
    request_id: RequestId = None
    #: on ``busy``: milliseconds to wait before retrying, for a session
    #: refused at the door (protocol 1.3; since 2.0 only before any of its
    #: audio) or a sentence no engine server
    #: could take now (HTTP's ``Retry-After``)
    retry_after_ms: int | None = None
    #: on ``busy`` for an utterance that waited in the admission queue and
    #: was refused (the deadline passed, the server began draining): how
    #: long it waited, from its first committed text (protocol 1.4)
    waited_ms: int | None = None
    #: on ``resume_expired`` (since 2.2.0): per context, the text the client
    #: sent and did not hear, while the server still holds it
    #: (``resume_report_s``); null otherwise
    unspoken: list[UnspokenText] | None = None


ServerMessage = (
    SessionCreated
    | SessionUpdated
    | AudioStart
    | Alignment
    | AudioDone
    | AudioCancelled
    | SessionDone
    | Pong
    | VoiceListResult
    | VoiceAddResult
    | VoiceRemoveResult
    | AudioChunk
    | WarningEvent
    | Error
    | SessionResumed
)
SERVER_MESSAGES: tuple[type[_Message], ...] = (
    SessionCreated,
    SessionUpdated,
    AudioStart,
    Alignment,
    AudioDone,
    AudioCancelled,
    SessionDone,
    Pong,
    VoiceListResult,
    VoiceAddResult,
    VoiceRemoveResult,
    AudioChunk,
    WarningEvent,
    Error,
    SessionResumed,
)

_CLIENT_TAGS: dict[str, type[_Message]] = {
    str(cls.__struct_config__.tag): cls for cls in CLIENT_MESSAGES
}

client_decoder: msgspec.json.Decoder[ClientMessage] = msgspec.json.Decoder(ClientMessage)
server_decoder: msgspec.json.Decoder[ServerMessage] = msgspec.json.Decoder(ServerMessage)
_encoder = msgspec.json.Encoder()
_any_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def encode(message: _Message) -> bytes:
    return _encoder.encode(message)


def encode_text(message: _Message) -> str:
    return _encoder.encode(message).decode("utf-8")


def decode_client(data: str | bytes) -> ClientMessage:
    """Decode one client text frame or raise ``GatewayError`` with the right
    registry code and msgspec's message (which names the bad field's path)."""
    try:
        decoded = client_decoder.decode(data)
    except msgspec.DecodeError:
        pass  # classify below: the typed fast path failed
    except RecursionError:
        raise too_deep() from None
    else:
        return _checked(decoded)
    try:
        raw = _any_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise GatewayError(ErrorCode.INVALID_JSON, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise too_deep() from None
    if not isinstance(raw, dict):
        raise GatewayError(
            ErrorCode.INVALID_MESSAGE,
            f"a message must be a JSON object, got {type(raw).__name__}",
        )
    kind = raw.get("type")
    if kind is None:
        raise GatewayError(ErrorCode.INVALID_MESSAGE, "missing field `type` - at `$`")
    if not isinstance(kind, str):
        raise GatewayError(ErrorCode.INVALID_MESSAGE, "`type` must be a string - at `$.type`")
    cls = _CLIENT_TAGS.get(kind)
    if cls is None:
        known = ", ".join(sorted(_CLIENT_TAGS))
        raise GatewayError(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind!r}; known types: {known}"
        )
    try:
        message: ClientMessage = msgspec.convert(raw, cls)  # type: ignore[assignment]
    except msgspec.ValidationError as exc:
        code = ErrorCode.INVALID_CONFIG if cls is SessionConfig else ErrorCode.INVALID_MESSAGE
        raise GatewayError(code, f"{kind}: {exc}") from None
    except RecursionError:
        raise too_deep() from None
    return _checked(message)


#: the field names of ``session.config`` (a message's other keys are ignored
#: and named in a ``warning``)
CONFIG_FIELDS: frozenset[str] = frozenset({"type", *SessionConfig.__struct_fields__})


def unknown_config_fields(data: str | bytes) -> list[str]:
    """The keys of a ``session.config`` frame that name no field of it, in
    order (``data`` already decoded once as a ``SessionConfig``)."""
    raw = _any_decoder.decode(data)
    return [key for key in raw if key not in CONFIG_FIELDS] if isinstance(raw, dict) else []


def too_deep() -> GatewayError:
    """JSON nested deeper than the decoder's recursion limit (about 1,000
    levels): a client mistake, never a server failure.  Shared with the HTTP
    routes."""
    return GatewayError(
        ErrorCode.INVALID_MESSAGE,
        "the JSON is nested too deeply; no message of this protocol nests more than a few levels",
    )


def check_no_nul(text: str, name: str, path: str, param: str | None = None) -> None:
    """Text to be spoken holds no NUL (the phonemizer is C code; a NUL would
    cut the sentence short): ``invalid_message``, worded alike for the
    WebSocket's ``input.text`` and the HTTP API's ``input``."""
    if "\x00" in text:
        raise GatewayError(
            ErrorCode.INVALID_MESSAGE,
            f"{name} contains a NUL character (U+0000); remove it - at `{path}`",
            param=param,
        )


def _checked(message: ClientMessage) -> ClientMessage:
    """Checks the types cannot express (``check_no_nul``)."""
    if isinstance(message, InputText):
        check_no_nul(message.text, "input.text", "$.text")
    return message
