"""The protocol types, their decoders and docs/protocol.md kept in step.

Pure: no server, no engine.  Every tagged message class found in
``gateway.protocol`` must have example data here (so a new message without a
test fails), round-trip through its direction's decoder, and be documented.
"""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway import protocol
from gateway.engines.base import VoiceInfo
from gateway.errors import CloseCode, ErrorCode, GatewayError
from gateway.session.config import apply_config, default_config

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")

# --------------------------------------------------------------------------
# example data, one per message class
# --------------------------------------------------------------------------

_EFFECTIVE = protocol.EffectiveConfig(
    voice="joe",
    language="en-US",
    speed=1.25,
    response_format="pcm",
    stream_audio=True,
    encoding="pcm_s16le",
    sample_rate=22050,
    frame_ms=20,
    frame_samples=441,
    split_granularity="auto",
    flow_control="ack",
    max_lead_ms=500,
    timestamps=True,
    framing="tagged",
    model="piper",
    input_format="ssml",
    normalize=False,
    emoji="name",
    pronunciations={"SQL": "sequel"},
    debug_engine_text=True,
    word_timestamps=False,
    seed=12345,
)
_LIMITS = protocol.Limits(
    max_message_bytes=1_048_576,
    max_input_text_bytes=65_536,
    max_utterance_chars=20_000,
    max_contexts=8,
    max_buffered_ms=2000,
    config_timeout_s=10.0,
    idle_timeout_s=30.0,
    stall_timeout_s=10.0,
)

EXAMPLES: dict[type[Any], Any] = {
    # client -> server
    protocol.SessionConfig: protocol.SessionConfig(
        voice="joe",
        speaker="JOE",
        language="Auto",
        speed=1.0,
        response_format="pcm",
        stream_audio=True,
        encoding="mulaw",
        sample_rate=8000,
        frame_ms=20,
        split_granularity="sentence",
        flow_control="realtime",
        max_lead_ms=300,
        timestamps=True,
        framing="tagged",
        model="tts-1",
        task_type="CustomVoice",
        instructions="",
        ref_audio="",
        ref_text="",
        x_vector_only_mode=False,
        speaker_embedding=None,
        max_new_tokens=2048,
        initial_codec_chunk_frames=4,
        non_streaming_mode=False,
        word_timestamps=False,
        seed=-42,
        input_format="plain",
        normalize=False,
        emoji="name",
        pronunciations={"GIF": "jif", "St. Louis": "saint louis"},
        debug_engine_text=True,
    ),
    protocol.InputText: protocol.InputText(text="Hello there. ", context_id="a"),
    protocol.InputFlush: protocol.InputFlush(context_id="a"),
    protocol.InputDone: protocol.InputDone(),
    protocol.Cancel: protocol.Cancel(context_id="*"),
    protocol.Playback: protocol.Playback(played_ms=1234.5, context_id="a"),
    protocol.Ping: protocol.Ping(id=7),
    protocol.SessionClose: protocol.SessionClose(),
    protocol.VoiceList: protocol.VoiceList(request_id="l1"),
    protocol.VoiceAdd: protocol.VoiceAdd(
        name="Ana María",
        audio="UklGRiQAAABXQVZF",
        consent=True,
        ref_text="Hello there.",
        description="calm",
        request_id=2,
    ),
    protocol.VoiceRemove: protocol.VoiceRemove(name="ana maría", request_id=None),
    protocol.SessionResume: protocol.SessionResume(
        resume_token="k" * 43,
        received=[
            protocol.ReceivedMessages(context_id=None, messages=12),
            protocol.ReceivedMessages(context_id="b", messages=0),
        ],
    ),
    # server -> client
    protocol.SessionCreated: protocol.SessionCreated(
        session_id="0123456789ab",
        protocol_version=protocol.PROTOCOL_VERSION,
        engine="piper",
        voices=[
            protocol.VoiceDescription(
                name="joe",
                language="en-US",
                language_name="English",
                sample_rate=22050,
                quality="medium",
                streaming=True,
            )
        ],
        defaults=_EFFECTIVE,
        limits=_LIMITS,
        capabilities=protocol.EngineCapabilities(
            sample_rates=[22050],
            alignment=True,
            cloning=False,
            instructions=False,
            languages=["en-US"],
            input="segments",
            max_concurrency=0,
            typical_first_chunk_ms=85.0,
            normalizes_text=True,
        ),
        resume_token="t" * 43,
        resume_window_s=30.0,
    ),
    protocol.SessionResumed: protocol.SessionResumed(
        session_id="0123456789ab",
        contexts=[
            protocol.ResumedContext(context_id=None, text_chars=57, next_sequence=12),
            protocol.ResumedContext(context_id="b", text_chars=0, next_sequence=0),
        ],
        replayed_messages=3,
    ),
    protocol.SessionUpdated: protocol.SessionUpdated(config=_EFFECTIVE, limits=_LIMITS),
    protocol.AudioStart: protocol.AudioStart(
        context_id="a",
        utterance_index=3,
        sentence_index=1,
        sentence_text="It was a sunny day.",
        format="pcm",
        encoding="pcm_s16le",
        sample_rate=22050,
        context_number=2,
        engine_text="It was a sunny day.",
    ),
    protocol.Alignment: protocol.Alignment(
        context_id=None,
        utterance_index=0,
        sentence_index=0,
        words=[
            protocol.WordTimestamp(
                word="**Hello**", start_ms=0.0, end_ms=310.5, char_start=0, char_end=9
            ),
            protocol.WordTimestamp(
                word="there.", start_ms=310.5, end_ms=620.0, char_start=10, char_end=16
            ),
        ],
    ),
    protocol.AudioDone: protocol.AudioDone(
        context_id="a",
        utterance_index=3,
        sentence_index=1,
        total_bytes=52_920,
        audio_ms=1200.0,
        error=False,
        cancelled=True,
    ),
    protocol.AudioCancelled: protocol.AudioCancelled(
        context_id="a",
        utterance_index=3,
        sent_ms=1800.0,
        played_ms=950.0,
        position_source="played_ms",
        spoken_text="Hello there.",
        unspoken_text="It was a sunny day.",
    ),
    protocol.SessionDone: protocol.SessionDone(
        context_id="a",
        utterance_index=3,
        total_sentences=2,
        cancelled=False,
        metrics=protocol.UtteranceMetrics(
            queue_ms=1.5,
            first_audio_ms=85.25,
            audio_ms=2400.0,
            compute_ms=600.0,
            compute_rtf=0.25,
            sentences=2,
        ),
    ),
    protocol.Pong: protocol.Pong(id="p1"),
    protocol.VoiceListResult: protocol.VoiceListResult(
        request_id="l1",
        voices=[
            {"name": "joe", "type": "builtin", "language": "en-US", "sample_rate": 22050},
            {"name": "alloy", "type": "alias", "target": "joe", "available": True},
            {"name": "Ana María", "type": "uploaded", "duration_s": 2.5, "speakable": False},
        ],
    ),
    protocol.VoiceAddResult: protocol.VoiceAddResult(
        request_id=2,
        voice={
            "id": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
            "name": "Ana María",
            "format": "wav",
            "media_type": "audio/wav",
            "sample_rate": 16000,
            "duration_s": 2.5,
            "size_bytes": 80044,
            "consent": "true",
            "ref_text": "Hello there.",
            "description": "calm",
            "created_at": 1700000000.25,
            "type": "uploaded",
            "speakable": False,
        },
    ),
    protocol.VoiceRemoveResult: protocol.VoiceRemoveResult(
        request_id=None, name="Ana María", id="0f1e2d3c4b5a69788796a5b4c3d2e1f0", deleted=True
    ),
    protocol.AudioChunk: protocol.AudioChunk(
        context_id=None,
        utterance_index=0,
        sentence_index=1,
        chunk_id=3,
        chunk_start_ms=0,
        chunk_end_ms=1460,
        sample_rate=22050,
        audio_b64="",
        timestamps=[protocol.ChunkWord(word="Hello", start_ms=0.0, end_ms=371.5)],
    ),
    protocol.WarningEvent: protocol.WarningEvent(
        code="unknown_fields",
        message="unknown fields ignored: `vioce` (check their spelling)",
        fields=["vioce"],
    ),
    protocol.Error: protocol.Error(
        code=ErrorCode.INTERNAL,
        message="synthesis of sentence 1 failed",
        fatal=False,
        context_id="a",
        partial_audio=True,
        action="sentence_skipped",
        request_id=None,
    ),
}


def _tag(cls: type[Any]) -> str:
    return str(cls.__struct_config__.tag)


def _message_classes() -> set[type[Any]]:
    """Every tagged Struct defined in ``gateway.protocol`` (the untagged
    payload structs and the abstract base ``_Message`` excluded)."""
    found = set()
    for _, cls in inspect.getmembers(protocol, inspect.isclass):
        if (
            issubclass(cls, msgspec.Struct)
            and cls.__module__ == protocol.__name__
            and cls is not protocol._Message
            and cls.__struct_config__.tag is not None
        ):
            found.add(cls)
    return found


MESSAGE_CLASSES = sorted(_message_classes(), key=_tag)


def test_every_message_class_has_example_data() -> None:
    assert _message_classes() == set(EXAMPLES), (
        "a message class was added or removed: give it an example in EXAMPLES "
        "and a section in docs/protocol.md"
    )


def test_direction_tuples_match_the_unions() -> None:
    assert set(typing.get_args(protocol.ClientMessage)) == set(protocol.CLIENT_MESSAGES)
    assert set(typing.get_args(protocol.ServerMessage)) == set(protocol.SERVER_MESSAGES)
    assert not set(protocol.CLIENT_MESSAGES) & set(protocol.SERVER_MESSAGES)
    assert set(protocol.CLIENT_MESSAGES) | set(protocol.SERVER_MESSAGES) == _message_classes()


def test_tags_are_unique() -> None:
    tags = [_tag(cls) for cls in _message_classes()]
    assert len(tags) == len(set(tags))


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=_tag)
def test_round_trip(cls: type[Any]) -> None:
    example = EXAMPLES[cls]
    assert type(example) is cls
    wire = protocol.encode(example)
    assert msgspec.json.decode(wire)["type"] == _tag(cls)
    assert protocol.encode_text(example) == wire.decode("utf-8")
    if cls in protocol.CLIENT_MESSAGES:
        decoded = protocol.decode_client(wire)
    else:
        decoded = protocol.server_decoder.decode(wire)
    assert decoded == example
    assert protocol.encode(decoded) == wire


def test_session_config_omits_unset_fields() -> None:
    wire = msgspec.json.decode(protocol.encode(protocol.SessionConfig(voice="joe")))
    assert wire == {"type": "session.config", "voice": "joe"}


def test_protocol_version_is_semver() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", protocol.PROTOCOL_VERSION)
    assert f"`{protocol.PROTOCOL_VERSION}`" in DOC


# --------------------------------------------------------------------------
# docs/protocol.md in step with the code
# --------------------------------------------------------------------------

_ERROR_HEADER = "| code | fatal | close code | HTTP status | OpenAI type | meaning |"
_FATAL_WORDS = {"never": "no", "always": "yes", "first_config": "before first config"}


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _section(heading_fragment: str) -> str:
    """The text under the first heading containing the fragment, up to the
    next heading of the same or a higher level."""
    lines = DOC.splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^(#+) ", line)
        if match and heading_fragment in line:
            level = len(match.group(1))
            body = []
            for later in lines[i + 1 :]:
                other = re.match(r"^(#+) ", later)
                if other and len(other.group(1)) <= level:
                    break
                body.append(later)
            return "\n".join(body)
    raise AssertionError(f"docs/protocol.md has no heading containing {heading_fragment!r}")


def test_error_table_matches_the_registry() -> None:
    assert _ERROR_HEADER in DOC
    rows = {
        _cells(line)[0].strip("`"): _cells(line)
        for line in DOC.splitlines()
        if re.match(r"^\| `[a-z_]+` \|", line) and len(_cells(line)) == 6
    }
    for code in ErrorCode:
        assert str(code) in rows, f"error code {code} missing from docs/protocol.md"
        _, fatal, close, http, openai_type, meaning = rows[str(code)]
        spec = code.spec
        assert fatal == _FATAL_WORDS[spec.fatal], code
        expected_close = str(int(spec.close_code)) if spec.close_code is not None else "-"
        assert close.split()[0] == expected_close, code
        assert http == str(spec.http_status), code
        assert openai_type == f"`{spec.openai_type}`", code
        assert meaning, code
    error_rows = {name for name in rows if name in {str(c) for c in ErrorCode}}
    assert error_rows == {str(c) for c in ErrorCode}


def test_close_code_table_lists_every_close_code() -> None:
    documented = {int(m) for m in re.findall(r"^\| (\d{4}) \|", DOC, re.MULTILINE)}
    assert documented == {int(c) for c in CloseCode}


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=_tag)
def test_every_message_is_documented_with_its_fields(cls: type[Any]) -> None:
    tag = _tag(cls)
    assert re.search(rf"^#+ .*`{re.escape(tag)}`", DOC, re.MULTILINE), (
        f"no heading for `{tag}` in docs/protocol.md"
    )
    section = _section(f"`{tag}`")
    assert "| `type` |" in section, tag
    for name in cls.__struct_fields__:
        assert f"| `{name}` |" in section, f"field `{name}` of `{tag}` is not in its table"


@pytest.mark.parametrize(
    "cls",
    [
        protocol.EffectiveConfig,
        protocol.Limits,
        protocol.EngineCapabilities,
        protocol.VoiceDescription,
        protocol.UtteranceMetrics,
        protocol.WordTimestamp,
        protocol.ReceivedMessages,
        protocol.ResumedContext,
    ],
    ids=lambda cls: cls.__name__,
)
def test_nested_structs_are_documented(cls: type[Any]) -> None:
    for name in cls.__struct_fields__:
        assert f"| `{name}` |" in DOC, f"field `{name}` of {cls.__name__} is not documented"


def test_every_session_config_field_is_documented() -> None:
    section = _section("`session.config`")
    for name in protocol.SessionConfig.__struct_fields__:
        assert f"| `{name}` |" in section, name


def test_endpoint_and_low_latency_settings_are_named() -> None:
    assert "/v1/audio/speech/stream" in DOC
    for setting in ('"response_format": "pcm"', '"stream_audio": true', '"frame_ms": 20'):
        assert setting in DOC


# --------------------------------------------------------------------------
# decode_client: every failure has its registry code and names the field
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "code", "needle"),
    [
        (b"{not json", ErrorCode.INVALID_JSON, "JSON"),
        (b"\xff\xfe", ErrorCode.INVALID_JSON, "JSON"),
        ("", ErrorCode.INVALID_JSON, "JSON"),
        ('[{"type": "ping"}]', ErrorCode.INVALID_MESSAGE, "JSON object, got list"),
        ("null", ErrorCode.INVALID_MESSAGE, "JSON object"),
        ('"ping"', ErrorCode.INVALID_MESSAGE, "JSON object"),
        ('{"text": "hi"}', ErrorCode.INVALID_MESSAGE, "missing field `type`"),
        ('{"type": 5}', ErrorCode.INVALID_MESSAGE, "`$.type`"),
        ('{"type": null}', ErrorCode.INVALID_MESSAGE, "missing field `type`"),
        ('{"type": "input.text", "text": 5}', ErrorCode.INVALID_MESSAGE, "`$.text`"),
        ('{"type": "input.text"}', ErrorCode.INVALID_MESSAGE, "`text`"),
        ('{"type": "input.done", "context_id": 3}', ErrorCode.INVALID_MESSAGE, "`$.context_id`"),
        ('{"type": "playback", "played_ms": -1}', ErrorCode.INVALID_MESSAGE, "`$.played_ms`"),
        ('{"type": "playback", "played_ms": "1"}', ErrorCode.INVALID_MESSAGE, "`$.played_ms`"),
        ('{"type": "speak", "text": "hi"}', ErrorCode.UNKNOWN_TYPE, "'speak'"),
        ('{"type": "Session.Config"}', ErrorCode.UNKNOWN_TYPE, "known types"),
        ('{"type": "session.config", "speed": 9}', ErrorCode.INVALID_CONFIG, "`$.speed`"),
        ('{"type": "session.config", "speed": "fast"}', ErrorCode.INVALID_CONFIG, "`$.speed`"),
        ('{"type": "session.config", "frame_ms": 5}', ErrorCode.INVALID_CONFIG, "`$.frame_ms`"),
        (
            '{"type": "session.config", "sample_rate": 96000}',
            ErrorCode.INVALID_CONFIG,
            "`$.sample_rate`",
        ),
        (
            '{"type": "session.config", "max_lead_ms": 50}',
            ErrorCode.INVALID_CONFIG,
            "`$.max_lead_ms`",
        ),
        (
            '{"type": "session.config", "encoding": "opus"}',
            ErrorCode.INVALID_CONFIG,
            "`$.encoding`",
        ),
        (
            '{"type": "session.config", "stream_audio": "yes"}',
            ErrorCode.INVALID_CONFIG,
            "`$.stream_audio`",
        ),
        (
            '{"type": "voice.add", "name": "a", "consent": true}',
            ErrorCode.INVALID_MESSAGE,
            "`audio`",
        ),
        ('{"type": "voice.remove", "name": 5}', ErrorCode.INVALID_MESSAGE, "`$.name`"),
    ],
)
def test_decode_client_classifies_errors(data: str | bytes, code: ErrorCode, needle: str) -> None:
    with pytest.raises(GatewayError) as caught:
        protocol.decode_client(data)
    assert caught.value.code is code
    assert needle in caught.value.message


def test_unknown_fields_in_other_client_messages_are_ignored() -> None:
    message = protocol.decode_client('{"type": "input.text", "text": "a", "future": 1}')
    assert message == protocol.InputText(text="a")


def test_unknown_config_fields_are_decoded_and_named() -> None:
    """vllm-omni's models ignore unknown fields: so does ``session.config``
    since 2.0.0, and the reader names them (the endpoint warns)."""
    data = '{"type": "session.config", "bogus": 1, "voice": "joe", "seed": 7, "zz": null}'
    message = protocol.decode_client(data)
    assert message == protocol.SessionConfig(voice="joe", seed=7)
    assert protocol.unknown_config_fields(data) == ["bogus", "zz"]


def test_null_config_fields_decode_as_null() -> None:
    message = protocol.decode_client('{"type": "session.config", "voice": null}')
    assert isinstance(message, protocol.SessionConfig)
    assert message.voice is None and message.speed is msgspec.UNSET


# --------------------------------------------------------------------------
# session.config semantics documented in docs/protocol.md (pure)
# --------------------------------------------------------------------------

_VOICES = [
    VoiceInfo(
        name="joe",
        language="en-US",
        language_name="English",
        sample_rate=22050,
        language_aliases=("en_US",),
    ),
    VoiceInfo(name="ana", language="es-ES", language_name="Spanish", sample_rate=16000),
]


def _apply(current: protocol.EffectiveConfig, **fields: Any) -> protocol.EffectiveConfig:
    return apply_config(current, protocol.SessionConfig(**fields), _VOICES, "piper")


def test_config_merge_keeps_omitted_and_null_fields() -> None:
    start = default_config(_VOICES[0], "piper")
    first = _apply(start, speed=1.5, response_format="pcm")
    second = _apply(first, speed=None, encoding="alaw")
    assert second.speed == 1.5 and second.response_format == "pcm"
    assert second.encoding == "alaw"


def test_vllm_omni_default_values_are_accepted_silently() -> None:
    start = default_config(_VOICES[0], "piper")
    same = _apply(
        start,
        task_type="CustomVoice",
        language="Auto",
        speed=1.0,
        instructions="",
        x_vector_only_mode=False,
        non_streaming_mode=False,
        word_timestamps=False,
        max_new_tokens=4096,
        speaker_embedding=None,
    )
    assert same == start


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"task_type": "VoiceClone"}, ErrorCode.UNSUPPORTED_OPTION, "task_type"),
        ({"instructions": "whisper"}, ErrorCode.UNSUPPORTED_OPTION, "instructions"),
        ({"ref_audio": "data:audio/wav;base64,AA"}, ErrorCode.UNSUPPORTED_OPTION, "ref_audio"),
        ({"word_timestamps": True}, ErrorCode.UNSUPPORTED_OPTION, "word_timestamps"),
        ({"speaker_embedding": [0.1]}, ErrorCode.UNSUPPORTED_OPTION, "speaker_embedding"),
        ({"max_new_tokens": -1}, ErrorCode.INVALID_CONFIG, "max_new_tokens"),
        ({"voice": "nobody"}, ErrorCode.UNKNOWN_VOICE, "voice"),
        ({"voice": "joe", "speaker": "ana"}, ErrorCode.INVALID_CONFIG, "voice"),
        ({"language": "fr"}, ErrorCode.UNSUPPORTED_OPTION, "language"),
        ({"model": "gpt-5"}, ErrorCode.INVALID_CONFIG, "model"),
        ({"flow_control": "ack"}, ErrorCode.INVALID_CONFIG, "flow_control"),
    ],
)
def test_rejected_config_values(fields: dict[str, Any], code: ErrorCode, param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        _apply(default_config(_VOICES[0], "piper"), **fields)
    assert caught.value.code is code
    assert caught.value.param == param


def test_voice_change_follows_native_rate_and_language() -> None:
    start = default_config(_VOICES[0], "piper")
    spanish = _apply(start, speaker="ANA")
    assert (spanish.voice, spanish.language, spanish.sample_rate) == ("ana", "es-ES", 16000)
    pinned = _apply(_apply(start, sample_rate=48000), voice="ana")
    assert pinned.sample_rate == 48000
    assert _apply(start, language="en_US").language == "en-US"
