"""The front-end stage's glue (``gateway.text.stage``): word timings mapped
onto the client's text, pauses, the lexicon file, the options an engine's
capabilities give.  Pure: no server, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.engines.base import Capabilities, WordTiming
from gateway.engines.orpheus.tags import EMOTION_TAGS
from gateway.text.frontend import Span, SpokenSegment
from gateway.text.stage import (
    LexiconError,
    frontend_options,
    load_lexicon,
    source_words,
)

# "**Pay** $5 now." read "Pay five dollars now." (markers silent, $5 atomic)
SOURCE = "**Pay** $5 now."
SPOKEN = SpokenSegment(
    source=SOURCE,
    text="Pay five dollars now.",
    spans=(
        Span(0, 0, 0, 2),  # ** silent
        Span(0, 3, 2, 5),  # Pay
        Span(3, 3, 5, 7),  # ** silent
        Span(3, 4, 7, 8),  # space
        Span(4, 16, 8, 10),  # $5 -> five dollars
        Span(16, 21, 10, 15),  # " now."
    ),
)


def _words(*names: str) -> tuple[WordTiming, ...]:
    return tuple(WordTiming(w, i * 100.0, i * 100.0 + 90) for i, w in enumerate(names))


def test_source_words_name_the_client_text_with_offsets() -> None:
    words = source_words(SPOKEN, _words("Pay", "five", "dollars", "now."))
    assert [w.text for w in words] == ["Pay", "$5", "now."]
    for w in words:
        assert SOURCE[w.char_start : w.char_end] == w.text
    # the rewritten piece is one word spanning both engine words' times
    assert (words[1].start_ms, words[1].end_ms) == (100.0, 290.0)


def test_source_words_identity_and_unknown_words() -> None:
    text = "Hello there, friend."
    plain = SpokenSegment(text, text, (Span(0, len(text), 0, len(text)),))
    words = source_words(plain, _words("Hello", "there,", "XYZZY", "friend."))
    assert [(w.text, w.char_start, w.char_end) for w in words] == [
        ("Hello", 0, 5),
        ("there,", 6, 12),
        ("friend.", 13, 20),
    ]


def test_the_server_lexicon_file(tmp_path: Path) -> None:
    assert load_lexicon("") == ()
    path = tmp_path / "lexicon.tsv"
    path.write_text("# written<TAB>spoken\nSQL\tsequel\nSt. Louis\tsaint louis\n", "utf-8")
    assert load_lexicon(str(path)) == (("SQL", "sequel"), ("St. Louis", "saint louis"))
    path.write_text("ok\tfine\nno tab here\n", "utf-8")
    with pytest.raises(LexiconError, match="line 2"):
        load_lexicon(str(path))
    with pytest.raises(LexiconError, match="cannot read"):
        load_lexicon(str(tmp_path / "missing.tsv"))


def test_options_from_controls_and_capabilities() -> None:
    orpheus_like = Capabilities(sample_rates=(24000,), markup_tags=EMOTION_TAGS)
    options = frontend_options(
        input_format="plain",
        normalize=False,
        emoji="name",
        pronunciations={"SQL": "ess cue ell"},
        language="en-US",
        capabilities=orpheus_like,
        lexicon=(("SQL", "sequel"), ("GIF", "jif")),
    )
    assert options.keep_tags == frozenset(EMOTION_TAGS)
    assert not options.engine_normalizes
    # the client's entries come after the server's: later ones win
    assert options.pronunciations == (("SQL", "sequel"), ("GIF", "jif"), ("SQL", "ess cue ell"))
    assert options.emoji == "name" and options.input_format == "plain"
    normalizing = Capabilities(sample_rates=(24000,), normalizes_text=True)
    assert frontend_options(
        input_format="markdown",
        normalize=True,
        emoji="drop",
        pronunciations={},
        language="en",
        capabilities=normalizing,
    ).engine_normalizes
