"""The text front-end in the WebSocket session: its controls in
``session.config``, sentences on the client's text, word offsets.

Driven through the session core on the real synthetic engine (its word
timings are the whitespace words of what it read), as in
``test_session_core.py``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from gateway import protocol
from gateway.errors import ErrorCode, GatewayError
from gateway.session.utterance import Utterance
from gateway.session.validation import MAX_PRONUNCIATIONS
from tests.session.test_session_core import CONFIG, Harness


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = Harness()
    yield harness
    await harness.session.shutdown()


def _collapse(text: str) -> str:
    return " ".join(text.split())


async def test_text_controls_are_applied_and_shown(h: Harness) -> None:
    (updated,) = h.handle(
        protocol.SessionConfig(
            input_format="ssml",
            normalize=False,
            emoji="name",
            pronunciations={" SQL ": "sequel"},
            debug_engine_text=True,
        )
    )
    assert isinstance(updated, protocol.SessionUpdated)
    config = updated.config
    assert (config.input_format, config.normalize, config.emoji) == ("ssml", False, "name")
    assert config.pronunciations == {"SQL": "sequel"} and config.debug_engine_text
    # left out: kept; {} clears the map
    (updated,) = h.handle(protocol.SessionConfig(pronunciations={}))
    assert isinstance(updated, protocol.SessionUpdated)
    assert updated.config.pronunciations == {} and updated.config.input_format == "ssml"


@pytest.mark.parametrize(
    "raw",
    [
        '{"type": "session.config", "input_format": "html"}',
        '{"type": "session.config", "emoji": "keep"}',
        '{"type": "session.config", "normalize": "yes"}',
        '{"type": "session.config", "pronunciations": ["SQL"]}',
    ],
)
def test_malformed_text_controls_are_invalid_config(raw: str) -> None:
    with pytest.raises(GatewayError) as info:
        protocol.decode_client(raw)
    assert info.value.code == ErrorCode.INVALID_CONFIG


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ({"": "x"}, "must not be empty"),
        ({"SQL": " "}, "must not be empty"),
        ({"w" * 101: "x"}, "100 characters"),
        ({"w": "x" * 301}, "300"),
        ({f"w{i}": "x" for i in range(MAX_PRONUNCIATIONS + 1)}, "entries"),
    ],
)
async def test_bad_pronunciations_are_refused_whole(
    h: Harness, entries: dict[str, str], needle: str
) -> None:
    h.handle(CONFIG)
    (error,) = h.handle(protocol.SessionConfig(pronunciations=entries, speed=2.0))
    assert isinstance(error, protocol.Error)
    assert error.code == ErrorCode.INVALID_CONFIG and needle in error.message
    assert h.session.config.speed == 1.0  # all or nothing


REPLY = "Sure! **Step one:** open the app.\n\nThen tap *Settings*, and pick `Dark mode`. Done."


async def test_word_timings_carry_offsets_in_the_client_text(h: Harness) -> None:
    h.handle(protocol.SessionConfig(voice="tone", stream_audio=True, timestamps=True))
    for token in re.findall(r"\S+\s*", REPLY):  # LLM-like tokens
        h.handle(protocol.InputText(text=token))
    h.handle(protocol.InputDone())
    await h.out.wait_for(protocol.SessionDone)
    starts = [e for e in h.out.events if isinstance(e, protocol.AudioStart)]
    assert _collapse(" ".join(s.sentence_text for s in starts)) == _collapse(REPLY)
    words = [w for e in h.out.events if isinstance(e, protocol.Alignment) for w in e.words]
    assert words
    for word in words:
        assert word.char_start is not None and word.char_end is not None
        assert REPLY[word.char_start : word.char_end] == word.word
    ends = [w.char_end for w in words]
    assert ends == sorted(ends)
    # every sentence's words lie inside it
    assert words[-1].char_end <= len(REPLY)


async def test_engine_text_only_when_asked(h: Harness) -> None:
    h.handle(protocol.SessionConfig(voice="tone", stream_audio=True))
    h.handle(protocol.InputText(text="Hello there."))
    h.handle(protocol.InputDone())
    await h.out.wait_for(protocol.SessionDone)
    (start,) = [e for e in h.out.events if isinstance(e, protocol.AudioStart)]
    assert start.engine_text is None
    h.handle(protocol.SessionConfig(input_format="plain", normalize=False, debug_engine_text=True))
    h.handle(protocol.InputText(text="Hello **there**."))
    h.handle(protocol.InputDone())
    await h.out.wait_for(protocol.SessionDone, 2)
    start = [e for e in h.out.events if isinstance(e, protocol.AudioStart)][-1]
    # plain and not normalized: the engine reads the client's text as it is
    assert start.engine_text == start.sentence_text == "Hello **there**."


def test_sentences_are_located_in_the_client_text() -> None:
    utt = Utterance(index=0, config=protocol.EffectiveConfig(**_effective()))
    utt.source_text = "  One two.   Three four.  One two."
    offsets = [utt.add_segment(t).source_start for t in ("One two.", "Three four.", "One two.")]
    assert offsets == [2, 13, 26]


def _effective() -> dict[str, object]:
    return {
        "voice": "tone",
        "language": "en-US",
        "speed": 1.0,
        "response_format": "pcm",
        "stream_audio": True,
        "encoding": "pcm_s16le",
        "sample_rate": 24000,
        "frame_ms": 20,
        "frame_samples": 480,
        "split_granularity": "auto",
        "flow_control": "none",
        "max_lead_ms": 1000,
        "timestamps": False,
        "framing": "raw",
        "model": "synthetic",
    }


async def test_ssml_left_open_is_reported_before_session_done(h: Harness) -> None:
    h.handle(protocol.SessionConfig(voice="tone", stream_audio=True, input_format="ssml"))
    text = "<speak>Hello there. <s>And this sentence"
    h.handle(protocol.InputText(text=text))
    h.handle(protocol.InputDone())
    await h.out.wait_for(protocol.SessionDone)
    kinds = [type(e) for e in h.out.events]
    error = next(e for e in h.out.events if isinstance(e, protocol.Error))
    assert error.code == ErrorCode.INVALID_SSML and f"character {len(text)}" in error.message
    assert kinds.index(protocol.Error) == kinds.index(protocol.SessionDone) - 1
    dones = [e for e in h.out.events if isinstance(e, protocol.AudioDone)]
    assert dones and all(d.audio_ms > 0 for d in dones)  # what came before is spoken
