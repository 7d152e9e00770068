"""The one duration estimate counts what will be spoken (issue 21): the
segment policy plans with the client's text before the front-end reads it,
so markup, link targets and emoji must not count as speech, and digits must
count as the words they become."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gateway.text.duration import SECONDS_PER_CHAR, estimate_seconds, spoken_chars

CORPORA = Path(__file__).resolve().parents[2] / "bench" / "text_corpus"


def replies(name: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (CORPORA / f"{name}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("written", "spoken"),
    [
        ("**Step 1:** Open the app.", "Step one: Open the app."),
        ("# Getting started", "Getting started"),
        ("Great job 😀👍", "Great job"),
        ("Read [the docs](https://example.com/docs/setup) first.", "Read the docs first."),
        ("- [x] Buy milk\n- [ ] Call mom", "Buy milk. Call mom."),
        ("Run this:\n```bash\nnpm install\nnpm run build\n```\nDone.", "Run this: Done."),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "a: one, b: two."),  # row by row
        ("It costs $1,234.56.", "It costs one thousand two hundred thirty four dollars fifty six."),
    ],
)
def test_markup_counts_nothing_and_digits_count_as_words(written: str, spoken: str) -> None:
    got, want = spoken_chars(written), len(spoken)
    assert 0.65 * want <= got <= 1.35 * want, (got, want)


def test_a_long_text_is_counted_as_a_short_one() -> None:
    """Past the length the estimate remembers (a segment a lexicon alias or a
    run of numbers made long), the count is the same as for its pieces."""
    piece = "Step 1: read it."
    long = " ".join([piece] * 400)  # and a space between each two
    assert len(long) > 2048 > len(piece)
    assert spoken_chars(long) == 400 * spoken_chars(piece) + 399


def test_text_already_spoken_is_counted_as_it_is() -> None:
    """The core and the stream pass the front-end's output: words."""
    text = "Then open the browser, and wait ten seconds for it."
    assert spoken_chars(text) == len(text)
    assert estimate_seconds(text, 2.0) == pytest.approx(len(text) * SECONDS_PER_CHAR / 2)


@pytest.mark.parametrize("corpus", ["markdown", "numbers"])
def test_the_estimate_is_near_the_spoken_form_over_the_corpora(corpus: str) -> None:
    """Each reply within 0.6x to 1.6x of its hand-written spoken form, and
    on the whole closer to it than the raw character count."""
    estimate_error = raw_error = 0.0
    for reply in replies(corpus):
        spoken = len(reply["spoken"])
        ratio = spoken_chars(reply["text"]) / spoken
        assert 0.6 <= ratio <= 1.6, (reply["id"], ratio)
        estimate_error += abs(math.log(ratio))
        raw_error += abs(math.log(len(reply["text"]) / spoken))
    assert estimate_error < 0.6 * raw_error
