"""The shared validator: one rule, one code and one message for WebSocket
``session.config`` and the HTTP API."""

from __future__ import annotations

import msgspec
import pytest

from gateway import protocol
from gateway.engines.base import VoiceInfo
from gateway.errors import ErrorCode, GatewayError
from gateway.session_config import apply_config, default_config
from gateway.validation import (
    MAX_INSTRUCTIONS_CHARS,
    SAMPLE_RATE_MAX,
    SAMPLE_RATE_MIN,
    SPEED_MAX,
    SPEED_MIN,
    check_instructions,
    check_language,
    check_model,
    check_sample_rate,
    check_speed,
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


def test_languages_match_any_spelling_or_auto() -> None:
    for spelling in ("en-US", "en_us", "English", "Auto", " auto "):
        assert check_language(spelling, VOICE) == "en-US"
