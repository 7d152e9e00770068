"""What a plugin reads from ``session.created`` and the ``session.config`` it sends."""

from __future__ import annotations

import pytest

from voice_gateway_wire.session import (
    FRAME_MS,
    ProtocolMismatch,
    check_protocol_version,
    engine_gives_word_timings,
    native_rate,
    resolve_language,
    session_config,
)

CREATED = {
    "protocol_version": "1.1.0",
    "voices": [
        {"name": "joe", "language": "en-US", "sample_rate": 22050},
        {"name": "eva", "language": "de-DE", "sample_rate": 24000},
    ],
}


def test_another_major_version_is_a_mismatch() -> None:
    with pytest.raises(ProtocolMismatch, match=r"3\.0\.0.*1\.x or 2\.x"):
        check_protocol_version({"protocol_version": "3.0.0"})
    with pytest.raises(ProtocolMismatch, match=r"0\.9\.0"):
        check_protocol_version({"protocol_version": "0.9.0"})
    with pytest.raises(ProtocolMismatch, match="unknown"):
        check_protocol_version({})
    assert check_protocol_version({"protocol_version": "1.7.3"}) == "1.7.3"
    # 2.0.0 changed only session.close, which the plugins never send
    assert check_protocol_version({"protocol_version": "2.0.0"}) == "2.0.0"


def test_word_timings_are_assumed_unless_declared_absent() -> None:
    assert engine_gives_word_timings({}) is True  # a 1.0.0 server declares nothing
    assert engine_gives_word_timings({"capabilities": {"alignment": False}}) is False
    assert engine_gives_word_timings({"capabilities": {"alignment": True}}) is True


def test_native_rate_of_a_voice_or_the_default() -> None:
    assert native_rate(CREATED, None) == 22050
    assert native_rate(CREATED, " EVA ") == 24000
    assert native_rate(CREATED, "nobody") is None


def test_a_bare_language_names_the_voices_own() -> None:
    created = CREATED
    assert resolve_language("en", created, None) == "en-US"
    assert resolve_language("EN", created, "Joe") == "en-US"
    assert resolve_language("de", created, "eva") == "de-DE"
    assert resolve_language("fr", created, "joe") == "fr"  # the gateway refuses it
    assert resolve_language("en_GB", created, "joe") == "en_GB"
    assert resolve_language("auto", created, "joe") == "auto"
    assert resolve_language(None, created, "joe") is None


def test_session_config_is_tagged_realtime_pcm() -> None:
    config = session_config(
        sample_rate=16000, voice="joe", speed=None, language=None, timestamps=True
    )
    assert config == {
        "type": "session.config",
        "response_format": "pcm",
        "encoding": "pcm_s16le",
        "stream_audio": True,
        "frame_ms": FRAME_MS,
        "sample_rate": 16000,
        "framing": "tagged",
        "flow_control": "realtime",
        "timestamps": True,
        "voice": "joe",
    }
    lead = session_config(
        sample_rate=24000, voice=None, speed=1.5, language="de", timestamps=False, max_lead_ms=300
    )
    assert (lead["speed"], lead["language"], lead["max_lead_ms"]) == (1.5, "de", 300)
    assert "voice" not in lead
