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
            lambda: check_instructions("whisper", "piper"),
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


def test_languages_match_any_spelling_or_auto() -> None:
    for spelling in ("en-US", "en_us", "English", "Auto", " auto "):
        assert check_language(spelling, VOICE) == "en-US"
