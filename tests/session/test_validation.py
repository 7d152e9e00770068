"""The shared validator: one rule, one code and one message for WebSocket
``session.config`` and the HTTP API."""

from __future__ import annotations

import msgspec
import pytest

from gateway import protocol
from gateway.engines.base import VoiceInfo
from gateway.errors import ErrorCode, GatewayError
from gateway.session.config import apply_config, clone_options, default_config
from gateway.session.validation import (
    MAX_INSTRUCTIONS_CHARS,
    MAX_NAMED_FIELDS,
    SAMPLE_RATE_MAX,
    SAMPLE_RATE_MIN,
    SPEED_MAX,
    SPEED_MIN,
    check_instructions,
    check_language,
    check_model,
    check_sample_rate,
    check_seed,
    check_speed,
    check_vllm_fields,
    ignored_fields_message,
    language_matches,
    named_fields,
    references_to_ref_audio,
    unknown_fields,
)

VOICE = VoiceInfo(
    name="joe",
    language="en-US",
    language_name="English",
    sample_rate=22050,
    language_aliases=("en_US",),
)


def test_bounds_are_the_protocol_types() -> None:
    assert (SPEED_MIN, SPEED_MAX) == (0.25, 4.0)
    assert (SAMPLE_RATE_MIN, SAMPLE_RATE_MAX) == (8000, 48000)
    for speed in (SPEED_MIN, SPEED_MAX):  # the decoder accepts exactly the same range
        protocol.decode_client(msgspec.json.encode({"type": "session.config", "speed": speed}))
        assert check_speed(speed) == speed
    with pytest.raises(GatewayError):
        protocol.decode_client(b'{"type": "session.config", "sample_rate": 7999}')
    with pytest.raises(GatewayError) as info:
        check_sample_rate(7999)
    assert info.value.code == ErrorCode.INVALID_CONFIG and info.value.param == "sample_rate"


@pytest.mark.parametrize(
    ("check", "config", "code", "param"),
    [
        (
            lambda: check_model("gpt-5", "piper"),
            {"model": "gpt-5"},
            ErrorCode.INVALID_CONFIG,
            "model",
        ),
        (
            lambda: check_language("German", VOICE),
            {"language": "German"},
            ErrorCode.UNSUPPORTED_OPTION,
            "language",
        ),
        (
            lambda: check_instructions("whisper", "piper", honoured=False),
            {"instructions": "whisper"},
            ErrorCode.UNSUPPORTED_OPTION,
            "instructions",
        ),
        (lambda: check_speed(9.0), {"speed": 9.0}, ErrorCode.INVALID_CONFIG, "speed"),
    ],
)
def test_websocket_and_http_refuse_alike(
    check: object, config: dict[str, object], code: ErrorCode, param: str
) -> None:
    with pytest.raises(GatewayError) as direct:
        check()  # type: ignore[operator]
    message = protocol.SessionConfig(**config)  # type: ignore[arg-type]
    with pytest.raises(GatewayError) as ws:
        apply_config(default_config(VOICE, "piper"), message, [VOICE], "piper")
    assert (direct.value.code, direct.value.param) == (code, param)
    assert (ws.value.code, ws.value.param, ws.value.message) == (
        code,
        param,
        direct.value.message,
    )


def test_instructions_reach_an_engine_that_declares_them() -> None:
    """A style prompt is kept (stripped) for an engine whose capabilities say
    it follows one, cleared by an empty string, kept by null, and bounded."""
    current = default_config(VOICE, "upstream")
    assert current.instructions is None

    def config(**fields: object) -> protocol.EffectiveConfig:
        message = protocol.SessionConfig(**fields)  # type: ignore[arg-type]
        return apply_config(current, message, [VOICE], "upstream", instructions=True)

    current = config(instructions="  Speak softly. ")
    assert current.instructions == "Speak softly."
    assert config(speed=1.5).instructions == "Speak softly."  # left out: kept
    assert config(instructions=None).instructions == "Speak softly."  # null: kept
    assert config(instructions="").instructions is None  # empty: cleared
    too_long = "x" * (MAX_INSTRUCTIONS_CHARS + 1)
    with pytest.raises(GatewayError) as info:
        config(instructions=too_long)
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_CONFIG, "instructions")
    assert check_instructions(too_long[:-1], "upstream", honoured=True) == too_long[:-1]
    # an engine without a style prompt takes only an empty one
    assert check_instructions(" ", "piper", honoured=False) is None


@pytest.mark.parametrize(
    ("fields", "cloning", "options", "refused"),
    [
        ({}, False, {}, None),
        ({"task_type": "CustomVoice", "ref_audio": "", "max_new_tokens": 9}, False, {}, None),
        ({"ref_audio": "data:audio/wav;base64,AAAA"}, False, None, "ref_audio"),
        ({"task_type": "Base"}, False, None, "task_type"),
        # vllm-omni 0.30: tuning a model the gateway does not run: accepted
        (
            {"non_streaming_mode": True, "max_new_tokens": 1, "initial_codec_chunk_frames": 0},
            False,
            {},
            None,
        ),
        ({"speaker_embedding": [0.1]}, False, None, "speaker_embedding"),
        ({"speaker_embedding": [0.1, [0.2]]}, True, None, "speaker_embedding"),
        ({"speaker_embedding": [[0.1], [0.2]]}, True, {"speaker_embedding": [[0.1], [0.2]]}, None),
        ({"speaker_embedding": []}, False, {}, None),
        ({"ref_audio": ["https://a/1.wav", "https://a/2.wav"]}, False, None, "ref_audio"),
        ({"ref_audio_2": "https://a/2.wav"}, True, {"ref_audio_2": "https://a/2.wav"}, None),
        ({"ambient_sound": "rain on a tin roof"}, True, None, "ambient_sound"),
        ({"duration_seconds": 2.5}, True, None, "duration_seconds"),
        ({"extra_params": {"top_k": 5}}, True, None, "extra_params"),
        ({"extra_params": {}, "ambient_sound": ""}, False, {}, None),
        ({"max_new_tokens": -1}, False, None, "max_new_tokens"),
        ({"ref_text": "x" * 2001}, True, None, "ref_text"),
        (
            {"task_type": "Base", "ref_audio": "https://a/b.wav", "ref_text": "Hi."},
            True,
            {"task_type": "Base", "ref_audio": "https://a/b.wav", "ref_text": "Hi."},
            None,
        ),
        # defaults given to a cloning engine remove what was in force
        (
            {"ref_audio": "", "x_vector_only_mode": False},
            True,
            {"ref_audio": None, "x_vector_only_mode": None},
            None,
        ),
    ],
)
def test_vllm_omni_fields(
    fields: dict[str, object], cloning: bool, options: dict[str, object] | None, refused: str | None
) -> None:
    """vllm-omni's extension fields: silent at their defaults; the voice-clone
    ones become engine options for an engine that declares cloning."""
    if refused is None:
        assert check_vllm_fields(fields, cloning) == options
        return
    with pytest.raises(GatewayError) as info:
        check_vllm_fields(fields, cloning)
    assert info.value.param == refused
    assert len(info.value.message) < 200  # a megabyte of ref_audio is never echoed


def test_clone_options_are_kept_between_configs() -> None:
    def given(**fields: object) -> protocol.SessionConfig:
        return protocol.SessionConfig(**fields)  # type: ignore[arg-type]

    options = clone_options({}, given(ref_audio="data:a", ref_text="Hi."), cloning=True)
    assert options == {"ref_audio": "data:a", "ref_text": "Hi."}
    assert clone_options(options, given(speed=1.5), cloning=True) == options
    assert clone_options(options, given(ref_audio=""), cloning=True) == {"ref_text": "Hi."}
    with pytest.raises(GatewayError):
        clone_options({}, given(ref_audio="data:a"), cloning=False)


def test_languages_match_any_spelling_or_auto() -> None:
    for spelling in ("en-US", "en_us", "English", "Auto", " auto ", "en", "EN"):
        assert check_language(spelling, VOICE) == "en-US"
    # another region of the language, or another language, is not this voice
    for other in ("en-GB", "de", "e", "eng"):
        assert not language_matches(other, VOICE)


def test_ignored_fields_are_named_within_bounds() -> None:
    """A body of thousands of unknown keys is not echoed back whole."""
    names = [f"k{i}" for i in range(30)] + ["x" * 500]
    assert unknown_fields(["voice", *names], {"voice"}) == names
    named = named_fields(names[-25:])
    assert len(named) == MAX_NAMED_FIELDS and all(len(n) <= 64 for n in named)
    message = ignored_fields_message(names)
    assert "`k0`" in message and "and 11 more" in message and "x" * 65 not in message


def test_references_read_as_ref_audio_with_030_rules() -> None:
    ref = {"audio_path": "https://a/b.wav", "text": "Hi."}
    assert references_to_ref_audio({"input": "x", "references": [ref]}) == {
        "input": "x",
        "ref_audio": "https://a/b.wav",
        "ref_text": "Hi.",
    }
    same = {"references": [ref], "ref_audio": "https://a/b.wav", "ref_text": "Hi."}
    assert references_to_ref_audio(same)["ref_audio"] == "https://a/b.wav"
    for bad in (
        {"references": []},
        {"references": "https://a/b.wav"},
        {"references": [ref, ref]},
        {"references": [{"text": "no audio"}]},
        {"references": [ref], "ref_text": "Other."},
    ):
        with pytest.raises(GatewayError) as info:
            references_to_ref_audio(bad)
        assert info.value.param == "references"


def test_seed_bounds_and_engines() -> None:
    assert check_seed(None, "piper", honoured=False) is None
    assert check_seed(-(2**63), "piper", honoured=True) == -(2**63)
    with pytest.raises(GatewayError) as info:
        check_seed(2**63, "piper", honoured=True)
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_CONFIG, "seed")
    with pytest.raises(GatewayError) as info:
        check_seed(5, "upstream", honoured=False)
    assert (info.value.code, info.value.param) == (ErrorCode.UNSUPPORTED_OPTION, "seed")
    assert "'upstream'" in info.value.message
