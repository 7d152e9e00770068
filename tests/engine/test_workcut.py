"""The post-expansion cut (``gateway.engines.workcut``): pure, table-tested.

Every piece measures within the limit by the engine's own measure, the
pieces are the text's characters in order, and the cut falls at the best
boundary there is (a clause, then a word, then inside a word)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.engines.workcut import cut_ahead, cut_text


def chars(text: str) -> int:
    return len(text)


def symbols(text: str) -> int:
    """A measure that expands, as espeak does: ``*`` reads as "asterisk";
    a run of whitespace is one word break."""
    return sum(8 if c == "*" else 1 for c in text if not c.isspace()) + len(
        re.findall(r"\s+", text)
    )


ALIAS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike"


@pytest.mark.parametrize(
    ("text", "limit", "measure", "expected"),
    [
        # within the limit: the text itself, stripped
        ("  Hello there.  ", 20, chars, ["Hello there."]),
        ("", 5, chars, []),
        # clauses first: the cut falls after the comma, not mid-clause
        ("one two three, four five six.", 20, chars, ["one two three,", "four five six."]),
        # clauses packed together while they fit
        ("a b, c d, e f, g h.", 11, chars, ["a b, c d,", "e f, g h."]),
        # a clause over the limit is cut between words
        (
            ALIAS,
            25,
            chars,
            [
                "alpha bravo charlie",
                "delta echo foxtrot golf",
                "hotel india juliet kilo",
                "lima mike",
            ],
        ),
        # a word over the limit is cut inside it, in halves
        ("abcdefgh", 3, chars, ["ab", "cd", "ef", "gh"]),
        # the measure decides, not the characters: "*" weighs 8 (+1 a space)
        ("*a *a *a *a", 20, symbols, ["*a *a", "*a *a"]),
        # one character over the limit alone cannot be cut smaller
        ("**", 5, symbols, ["*", "*"]),
    ],
)
def test_cut_table(text: str, limit: int, measure, expected: list[str]) -> None:
    assert cut_text(text, limit, measure) == expected


def test_cut_numbers_read_out() -> None:
    """The issue's number run: each piece within the bound."""
    text = ("seven hundred seventy seven trillion seven hundred seventy seven billion " * 9).strip()
    pieces = cut_text(text, 300, chars)
    assert len(pieces) > 1
    assert all(len(p) <= 300 for p in pieces)
    assert " ".join(pieces) == text


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit"):
        cut_text("x", 0, chars)


@given(
    text=st.text(alphabet=st.sampled_from("ab*., ;!?\n\t\u2014"), max_size=300),
    limit=st.integers(1, 60),
)
def test_pieces_within_limit_and_in_order(text: str, limit: int) -> None:
    pieces = cut_text(text, limit, symbols)
    # nothing lost, nothing reordered: the pieces are the text's
    # non-space characters in order
    assert "".join("".join(p.split()) for p in pieces) == "".join(text.split())
    for piece in pieces:
        assert piece == piece.strip() and piece
        # within the limit unless it is one character (nothing smaller to run)
        assert symbols(piece) <= limit or len(piece) == 1
    # each piece is a stretch of the text (found in order)
    at = 0
    for piece in pieces:
        found = text.find(piece, at)
        assert found >= 0
        at = found + len(piece)


@given(
    words=st.lists(
        st.from_regex(re.compile(r"[a-z]{1,9}"), fullmatch=True), min_size=1, max_size=80
    )
)
def test_words_are_never_cut_when_a_word_fits(words: list[str]) -> None:
    text = " ".join(words)
    pieces = cut_text(text, 30, chars)
    for piece in pieces:
        assert all(w in words for w in piece.split())
        assert len(piece) <= 30


def lumpy(text: str) -> int:
    """A measure that does not add up: a text measures more whole than its
    words apart (espeak reads words in context)."""
    return symbols(text) + len(text.split()) // 3


@given(
    text=st.text(alphabet=st.sampled_from("ab*., ;"), max_size=300),
    limit=st.integers(1, 60),
)
def test_pieces_fit_whole_even_when_the_measure_does_not_add_up(text: str, limit: int) -> None:
    for piece in cut_text(text, limit, lumpy):
        assert lumpy(piece) <= limit or len(piece) == 1


@given(
    text=st.text(alphabet=st.sampled_from("ab*., ;"), max_size=400),
    limit=st.integers(1, 40),
    window=st.integers(2, 120),
)
def test_cut_ahead_looks_at_a_window_and_leaves_the_rest(
    text: str, limit: int, window: int
) -> None:
    """The first pieces fit, and with the rest they are the whole text in
    order; cutting the rest in turn ends (each call takes at least one piece)."""
    seen: list[str] = []
    rest = text
    for _ in range(len(text) + 1):
        pieces, rest = cut_ahead(rest, limit, lumpy, window)
        assert pieces or not rest.strip()
        for piece in pieces:
            assert lumpy(piece) <= limit or len(piece) == 1
        seen += pieces
        if not rest:
            break
    assert not rest
    assert "".join("".join(p.split()) for p in seen) == "".join(text.split())


def test_cut_ahead_of_a_long_alias_measures_a_window_not_the_text() -> None:
    calls: list[str] = []

    def counting(text: str) -> int:
        calls.append(text)
        return chars(text)

    text = " ".join([ALIAS] * 40)  # about 3,000 characters
    pieces, rest = cut_ahead(text, 50, counting)
    assert pieces and rest and all(len(p) <= 50 for p in pieces)
    assert sum(len(c) for c in calls) < 3 * 4 * 50  # a few windows' worth, not 3,000
