"""Tests of the incremental segmenter (``gateway/text/segmenter.py``).

Pure and fast: no server, no engine.  Rules: ``docs/segmentation.md``.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.engines.orpheus.tags import EMOTION_TAGS
from gateway.text.segmenter import (
    GRANULARITIES,
    Granularity,
    Segmenter,
    is_speakable,
)

HI, LO = "\ud83d", "\ude00"  # the two UTF-16 halves of U+1F600, as JSON decodes them
GRIN = "\U0001f600"


def run(
    text: str | list[str],
    granularity: Granularity = "auto",
    *,
    max_chars: int = 300,
) -> list[str]:
    """push() every chunk, then flush(); all segments in order (the engine
    declares Orpheus' emotion tags)."""
    seg = Segmenter(granularity, max_chars=max_chars, markup_tags=EMOTION_TAGS)
    chunks = [text] if isinstance(text, str) else text
    out: list[str] = []
    for chunk in chunks:
        out += seg.push(chunk)
    out += seg.flush()
    assert seg.buffered == ""
    return out


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def utf16_units(text: str) -> list[str]:
    """The text as UTF-16 code units (astral characters as surrogate halves)."""
    units: list[str] = []
    for ch in text:
        if ord(ch) > 0xFFFF:
            v = ord(ch) - 0x10000
            units += [chr(0xD800 + (v >> 10)), chr(0xDC00 + (v & 0x3FF))]
        else:
            units.append(ch)
    return units


# --- table-driven expected splits ---------------------------------------------

SPLITS: list[tuple[Granularity, str, list[str]]] = [
    # sentence boundaries
    ("sentence", "Hello world. How are you? Fine!", ["Hello world.", "How are you?", "Fine!"]),
    ("sentence", "Really?! Yes!!! No.", ["Really?!", "Yes!!!", "No."]),
    ("sentence", "Line one.\nLine two.", ["Line one.", "Line two."]),
    ("sentence", "你好。我很好！谢谢？", ["你好。", "我很好！", "谢谢？"]),
    ("sentence", "「你好。」他说。", ["「你好。」", "他说。"]),
    # closing quotes and brackets stay with their sentence
    ("sentence", 'He said "hi." Then he left.', ['He said "hi."', "Then he left."]),
    ("sentence", "(It works.) Then 'so.' Next", ["(It works.)", "Then 'so.'", "Next"]),
    ("sentence", "**Bold.** Plain.", ["**Bold.**", "Plain."]),
    # numbers: no split
    (
        "clause",
        "It costs 3.14 dollars, or 1,000 at 10:30. Next",
        ["It costs 3.14 dollars,", "or 1,000 at 10:30.", "Next"],
    ),
    ("sentence", "Version 1.2.3 is out. Yes", ["Version 1.2.3 is out.", "Yes"]),
    ("sentence", "In 2023. Then more", ["In 2023.", "Then more"]),
    ("sentence", "1. Preheat the oven. 2. Mix it.", ["1. Preheat the oven.", "2. Mix it."]),
    # abbreviations: no split
    (
        "sentence",
        "Dr. Smith met Mr. Jones and Mrs. Lee. Ms. Wu came.",
        ["Dr. Smith met Mr. Jones and Mrs. Lee.", "Ms. Wu came."],
    ),
    (
        "sentence",
        "He lives on Main St. near the park. Good.",
        ["He lives on Main St. near the park.", "Good."],
    ),
    ("sentence", "Fruit, e.g. apples, i.e. food. Yes", ["Fruit, e.g. apples, i.e. food.", "Yes"]),
    ("sentence", "Cats vs. Dogs is on. Go", ["Cats vs. Dogs is on.", "Go"]),
    (
        "sentence",
        "The U.S. Army and the U.K. Navy met. Then",
        ["The U.S. Army and the U.K. Navy met.", "Then"],
    ),
    ("sentence", "J. R. R. Tolkien wrote it. Yes", ["J. R. R. Tolkien wrote it.", "Yes"]),
    ("sentence", "So do I. Then we go.", ["So do I.", "Then we go."]),
    ("sentence", "Apples, pears, etc. are fruit. Yes", ["Apples, pears, etc. are fruit.", "Yes"]),
    ("sentence", "Apples, pears, etc. The end.", ["Apples, pears, etc.", "The end."]),
    ("sentence", "At 10 a.m. tomorrow we go. Ok", ["At 10 a.m. tomorrow we go.", "Ok"]),
    ("sentence", "We met at 10 a.m. Then we left.", ["We met at 10 a.m.", "Then we left."]),
    ("clause", "Use fruit, e.g., apples.", ["Use fruit,", "e.g., apples."]),
    # a period before a lower-case word is not a boundary
    ("sentence", "Approx. five of them. Yes", ["Approx. five of them.", "Yes"]),
    # URLs and e-mail addresses: no split inside; a sentence may end after one
    ("sentence", "Visit https://x.y/z?a=1 now. Then", ["Visit https://x.y/z?a=1 now.", "Then"]),
    ("clause", "See https://x.y:8080/a;b?c=1,2 now", ["See https://x.y:8080/a;b?c=1,2 now"]),
    (
        "sentence",
        "Go to www.x.com. Then mail a@b.com. Thanks",
        ["Go to www.x.com.", "Then mail a@b.com.", "Thanks"],
    ),
    # ellipses: a boundary only before whitespace and an upper-case letter
    ("sentence", "Wait... what? Yes", ["Wait... what?", "Yes"]),
    ("sentence", "Wait... What? Yes", ["Wait...", "What?", "Yes"]),
    ("sentence", "Wait\u2026 what", ["Wait\u2026 what"]),
    ("sentence", "Wait\u2026 What", ["Wait\u2026", "What"]),
    ("sentence", "Wait...What", ["Wait...What"]),
    ("sentence", 'He paused... "Who?"', ["He paused...", '"Who?"']),
    ("sentence", "他说……好吧。", ["他说……好吧。"]),
    # clause boundaries
    (
        "clause",
        "Well, I think so; maybe: yes \u2014 or no. Done",
        ["Well,", "I think so;", "maybe:", "yes \u2014", "or no.", "Done"],
    ),
    ("clause", "One thing\u2014another thing.", ["One thing\u2014", "another thing."]),
    ("clause", "Pages 10\u201320 and 1\u20142 only", ["Pages 10\u201320 and 1\u20142 only"]),
    ("clause", "你好，世界。", ["你好，", "世界。"]),
    ("clause", '"Hi," she said.', ['"Hi,"', "she said."]),
    # auto: the first segment at the first clause or sentence boundary, later ones at sentences
    (
        "auto",
        "Well, I think so, really. And then, more. End",
        ["Well,", "I think so, really.", "And then, more.", "End"],
    ),
    ("auto", "Hello there. Well, fine.", ["Hello there.", "Well, fine."]),
    ("auto", "No boundary at all here", ["No boundary at all here"]),
    # none: nothing is cut (but the cap)
    ("none", "Well, one. Two! Three?", ["Well, one. Two! Three?"]),
    # nothing speakable merges into the previous segment, or the next at the start
    ("sentence", "Hello. !!! World.", ["Hello. !!!", "World."]),
    ("sentence", "... Hello. World.", ["... Hello.", "World."]),
    ("sentence", "Hi. :)", ["Hi. :)"]),
    ("sentence", f"Hi. {GRIN} Bye.", ["Hi.", f"{GRIN} Bye."]),  # no boundary after the emoji
    ("sentence", f"Hi. {GRIN}! Bye.", [f"Hi. {GRIN}!", "Bye."]),
    ("sentence", "!!! ??? ...", ["!!! ??? ..."]),
    ("clause", "Yes, \u2014 no.", ["Yes, \u2014", "no."]),
    # emotion tags (Orpheus) stay whole and with the words they follow
    (
        "sentence",
        "That is funny <laugh>. Anyway, go on.",
        ["That is funny <laugh>.", "Anyway, go on."],
    ),
    ("sentence", "Ha. <laugh> Okay then.", ["Ha.", "<laugh> Okay then."]),
    ("clause", "Well <sigh>, fine. <gasp>Really?", ["Well <sigh>,", "fine.", "<gasp>Really?"]),
    ("sentence", "abcdefgh<chuckle>ijk", ["abcdefgh<chuckle>ijk"]),
    # whitespace only
    ("auto", "   \n ", []),
    ("auto", "", []),
]


@pytest.mark.parametrize(("granularity", "text", "expected"), SPLITS)
def test_expected_splits(granularity: Granularity, text: str, expected: list[str]) -> None:
    assert run(text, granularity) == expected
    # the same result whatever the arrival pattern
    assert run(list(text), granularity) == expected
    assert run(utf16_units(text), granularity) == expected


# --- streaming behaviour -------------------------------------------------------


def test_first_segment_leaves_before_flush() -> None:
    seg = Segmenter("auto")
    assert seg.push("Hello") == []
    assert seg.push(",") == []  # a boundary at the end of the buffer waits
    assert seg.push(" wor") == ["Hello,"]
    assert seg.push("ld, and more") == []  # later segments: sentences only
    assert seg.push(". Next") == ["world, and more."]
    assert seg.flush() == ["Next"]


def test_sentence_waits_for_next_visible_character() -> None:
    seg = Segmenter("sentence")
    assert seg.push("I met Dr.") == []
    assert seg.push(" ") == []
    assert seg.push("Smith. ") == []
    assert seg.push("\n") == []
    assert seg.push("He") == ["I met Dr. Smith."]
    assert seg.buffered.strip() == "He"
    assert seg.flush() == ["He"]
    assert seg.buffered == ""


def test_boundary_at_end_is_released_by_flush() -> None:
    seg = Segmenter("auto")
    assert seg.push("Hello world.") == []
    assert seg.flush() == ["Hello world."]


def test_flush_keeps_utterance_open_and_end_utterance_rearms_first_rule() -> None:
    seg = Segmenter("auto")
    assert seg.push("Yes,") == []
    assert seg.push(" indeed it is") == ["Yes,"]
    assert seg.flush() == ["indeed it is"]
    # same utterance: clause boundaries no longer cut
    assert seg.push("Well, fine") == []
    assert seg.flush() == ["Well, fine"]
    seg.end_utterance()
    assert seg.push("Well, fine") == ["Well,"]
    assert seg.flush() == ["fine"]


def test_modes_while_streaming() -> None:
    text = "One, two; three. Four, five. Six"
    assert run(text, "auto") == ["One,", "two; three.", "Four, five.", "Six"]
    assert run(text, "sentence") == ["One, two; three.", "Four, five.", "Six"]
    assert run(text, "clause") == ["One,", "two;", "three.", "Four,", "five.", "Six"]
    seg = Segmenter("none")
    assert seg.push(text) == []
    assert seg.flush() == [text]


def test_discard_drops_buffer_and_starts_new_utterance() -> None:
    seg = Segmenter("auto")
    assert seg.push("Hi, there friend") == ["Hi,"]
    assert seg.discard() == " there friend"
    assert seg.buffered == ""
    assert seg.push("Ok, go") == ["Ok,"]


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="granularity"):
        Segmenter("word")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_chars"):
        Segmenter(max_chars=0)


# --- candidates() and cut_at(): the places the policy may cut early ----------------


def cands(text: str, markup_tags: tuple[str, ...] = EMOTION_TAGS) -> list[tuple[str, str, int]]:
    seg = Segmenter("auto", markup_tags=markup_tags)
    seg.push("Ok. " + text)  # the first segment has left: only sentences cut now
    body = seg.buffered.lstrip()
    return [(body[: c.end], c.kind, c.words) for c in seg.candidates()]


def test_candidates_are_clause_phrase_and_word_boundaries() -> None:
    assert cands("And then the big dog, e.g., a pug and Dr. Who at 3 000 people went") == [
        ("And then", "word", 2),
        ("And then the big", "word", 4),
        ("And then the big dog,", "clause", 5),
        ("And then the big dog, e.g., a pug", "phrase", 8),
        ("And then the big dog, e.g., a pug and Dr. Who", "word", 11),
        ("And then the big dog, e.g., a pug and Dr. Who at 3 000", "word", 14),
        ("And then the big dog, e.g., a pug and Dr. Who at 3 000 people", "word", 15),
    ]


def test_candidates_need_confirmed_text() -> None:
    two_three = [("One", "word", 1), ("One two", "word", 2), ("One two three", "word", 3)]
    assert cands("One two three four") == two_three  # "four" may still grow
    assert cands("One two three four ") == two_three  # the next word has not begun
    # "an" may still become "and": a word boundary, not yet a phrase
    assert cands("One two an")[-1] == ("One two", "word", 2)
    assert cands("One two and ")[-1] == ("One two", "phrase", 2)


def test_candidates_keep_tokens_whole() -> None:
    assert cands("See x.com/a?b=1 y a@b.com z 3.14 w") == [
        ("See", "word", 1),
        ("See x.com/a?b=1", "word", 2),
        ("See x.com/a?b=1 y", "word", 3),
        ("See x.com/a?b=1 y a@b.com", "word", 4),
        ("See x.com/a?b=1 y a@b.com z", "word", 5),
        ("See x.com/a?b=1 y a@b.com z 3.14", "word", 6),
    ]


def test_candidates_never_cut_an_emotion_tag_from_its_words() -> None:
    assert cands("It was so funny <laugh> and we left") == [
        ("It", "word", 1),
        # not before the tag: after it (a tag is not a word)
        ("It was so funny <laugh>", "phrase", 4),
        ("It was so funny <laugh> and we", "word", 6),
    ]
    # a tag still arriving may be one: no cut before it yet
    assert cands("It was funny <la") == [("It", "word", 1)]
    assert ("It was funny", "word", 3) in cands("It was funny <laughing hard")  # no tag
    # text that only looks like the start of a tag cuts as any word
    assert cands("We said x < b and so")[1:] == [
        ("We said", "word", 2),
        ("We said x", "word", 3),
        ("We said x < b", "phrase", 4),
    ]


@pytest.mark.parametrize("tag", EMOTION_TAGS)
def test_the_cap_never_cuts_inside_an_emotion_tag(tag: str) -> None:
    text = "abcdefgh" + tag + "ijk"
    expected = ["abcdefgh", tag + "ijk"]
    assert run(text, "sentence", max_chars=12) == expected
    assert run(list(text), "sentence", max_chars=12) == expected  # one character at a time


def test_tags_come_from_the_engine_an_engine_without_them_reads_them_as_text() -> None:
    assert ("It was funny", "word", 3) not in cands("It was funny <laugh> and")
    assert ("It was funny", "word", 3) in cands("It was funny <laugh> and", markup_tags=())
    assert ("It was funny", "word", 3) not in cands("It was <x/> funny <x/> so", ("<x/>",))
    seg = Segmenter("sentence", max_chars=12)
    assert seg.push("abcdefgh<laugh>ijk") == ["abcdefgh<lau"]  # text: cut at the cap


def test_no_candidates_while_a_sentence_may_be_complete() -> None:
    assert cands("The quick brown fox jumps over the lazy dog.") == []
    assert cands("We met Dr.") == []
    assert cands("It is big, really") == [("It", "word", 1), ("It is big,", "clause", 3)]


def test_candidates_only_in_auto() -> None:
    for granularity in ("sentence", "clause", "none"):
        seg = Segmenter(granularity)  # type: ignore[arg-type]
        seg.push("one two three four five six")
        assert seg.candidates() == []


def test_cut_at_emits_and_ends_the_first_segment() -> None:
    seg = Segmenter("auto")
    assert seg.push("  I think that we should") == []
    assert seg.awaiting_first_segment
    end = seg.candidates()[-1].end
    assert seg.cut_at(end) == "I think that we"
    assert not seg.awaiting_first_segment
    assert seg.push(" go, then. Ok") == ["should go, then."]  # sentences only now
    assert seg.flush() == ["Ok"]
    with pytest.raises(ValueError):
        seg.cut_at(5)


# --- the length cap --------------------------------------------------------------


def test_cap_cuts_at_last_whitespace() -> None:
    text = " ".join(f"word{i}" for i in range(40))
    segments = run(text, "sentence", max_chars=50)
    assert all(len(s) <= 50 for s in segments)
    assert " ".join(segments) == text  # cut only between words
    assert segments == run(list(text), "sentence", max_chars=50)


def test_cap_applies_in_every_mode_and_keeps_numbers_and_urls_whole() -> None:
    text = "See https://example.com/a/b?c=1 and 1,234,567.89 units " * 6
    for granularity in GRANULARITIES:
        segments = run(text, granularity, max_chars=40)  # type: ignore[arg-type]
        assert all(len(s) <= 40 for s in segments)
        words = [w for s in segments for w in s.split()]
        assert words == text.split()


def test_cap_prefers_sentence_boundary_before_it() -> None:
    text = "Short one. " + "X" * 10 + " " + "y" * 30
    assert run(text, "sentence", max_chars=30) == ["Short one.", "X" * 10, "y" * 30]


def test_cap_without_whitespace_keeps_surrogate_pairs_and_marks() -> None:
    assert run("a" * 25, "sentence", max_chars=10) == ["a" * 10, "a" * 10, "a" * 5]
    # U+1F600 arriving as two halves at the cap (the cap counts code points)
    for text, expected in [
        ("a" * 9 + GRIN + "b" * 5, ["a" * 9 + GRIN, "b" * 5]),
        ("a" * 10 + GRIN + "b" * 5, ["a" * 10, GRIN + "b" * 5]),
    ]:
        assert run(text, "sentence", max_chars=10) == expected
        assert run(utf16_units(text), "sentence", max_chars=10) == expected
    # a combining acute accent right at the cap stays with its base
    text = "a" * 9 + "e\u0301" + "b" * 5
    expected = ["a" * 9, "e\u0301" + "b" * 5]
    assert run(text, "sentence", max_chars=10) == expected
    assert run(list(text), "sentence", max_chars=10) == expected
    # an emoji ZWJ sequence is not cut at its joiner
    family = "\U0001f468\u200d\U0001f469"
    text = "a" * 8 + family + "b" * 5
    segments = run(utf16_units(text), "sentence", max_chars=10)
    assert "".join(segments) == text and family in "".join(segments[:2])
    assert all(family in s or "\u200d" not in s for s in segments)


# --- characters split across pushes -----------------------------------------------


def test_surrogate_halves_are_joined() -> None:
    seg = Segmenter("sentence")
    assert seg.push("Hi " + HI) == []
    assert seg.push(LO + " there. Next") == [f"Hi {GRIN} there."]
    assert seg.flush() == ["Next"]


def test_dangling_high_surrogate_waits_through_flush() -> None:
    seg = Segmenter("sentence")
    assert seg.push("Hello " + HI) == []
    assert seg.flush() == ["Hello"]
    assert seg.buffered == HI
    assert seg.push(LO + " world.") == []
    assert seg.flush() == [f"{GRIN} world."]
    for s in ["Hello", f"{GRIN} world."]:
        s.encode("utf-8")  # no lone surrogate left in any segment


def test_combining_mark_in_next_push_is_joined() -> None:
    seg = Segmenter("sentence")
    assert seg.push("Cafe") == []
    assert seg.push("\u0301. Next") == ["Cafe\u0301."]
    # a mark after CJK punctuation is not cut from it
    assert run(["好。", "\u0301好"], "sentence") == ["好。\u0301好"]


# --- property: chunking invariance, nothing lost or duplicated -------------------

_WORDS = (
    "Hello world the Smith apples I J. R. a x 3.14 1,000 10:30 2023 1. Dr. Mr. Mrs. St."
    " e.g. i.e. etc. vs. U.S. a.m. p.m. https://x.y/z?a=1 www.x.com a@b.com"
    " . , ; : ! ? ?! ... \u2026 \u2014 \u2013 \" ' ( ) \u201c \u201d ** :) -"
    " \u3002 \uff01 \uff0c \u4f60\u597d \u300c \u300d"
)
FRAGMENTS = [
    *_WORDS.split(),
    *EMOTION_TAGS[:3],
    "<gas",  # with "p>" (or without): a tag assembled from two pieces, or not
    "p>",
    GRIN,
    "\U0001f44d\U0001f3fd",
    "e\u0301",
    "\u0301",
    "\U0001d400",
]
SPACES = ["", " ", " ", " ", "  ", "\n", "\n\n", "\t", "\u00a0"]

texts = st.lists(st.tuples(st.sampled_from(FRAGMENTS), st.sampled_from(SPACES)), max_size=40).map(
    lambda parts: "".join(a + b for a, b in parts)
)


def chunkings(units: list[str]) -> st.SearchStrategy[list[str]]:
    n = len(units)
    return st.sets(st.integers(1, max(1, n - 1)), max_size=n).map(
        lambda cuts: [
            "".join(units[a:b])
            for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), n], strict=True)
            if a < b
        ]
    )


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=texts,
    granularity=st.sampled_from(GRANULARITIES),
    max_chars=st.sampled_from([12, 25, 60, 300]),
    data=st.data(),
)
@example(text="Hi. " + GRIN + " Bye.", granularity="auto", max_chars=300, data=None)
def test_any_chunking_gives_the_same_segments(
    text: str, granularity: Granularity, max_chars: int, data: st.DataObject | None
) -> None:
    whole = run(text, granularity, max_chars=max_chars)
    units = utf16_units(text)  # split surrogate pairs, as JSON halves would arrive
    chunks = data.draw(chunkings(units)) if data is not None else units
    assert run(chunks, granularity, max_chars=max_chars) == whole
    assert run(units, granularity, max_chars=max_chars) == whole
    # nothing lost or duplicated, up to whitespace
    assert squash("".join(whole)) == squash(text)
    for i, segment in enumerate(whole):
        assert segment == segment.strip() and segment
        assert len(segment) <= max_chars
        segment.encode("utf-8")  # never half of a surrogate pair
        if i > 0:  # never a combining mark cut from what precedes it
            assert unicodedata.category(segment[0]) not in ("Mn", "Mc", "Me")
    # every emotion tag of the text is whole in one segment
    tags = re.compile("|".join(re.escape(t) for t in EMOTION_TAGS))
    assert sum(len(tags.findall(segment)) for segment in whole) == len(tags.findall(text))


def test_is_speakable() -> None:
    assert is_speakable("a") and is_speakable("7") and is_speakable("\u4f60")
    assert not is_speakable(":) ... \u2014 " + GRIN)


def test_documented_examples_hold() -> None:
    """The examples table of docs/segmentation.md matches the code."""
    doc = (Path(__file__).parents[2] / "docs" / "segmentation.md").read_text("utf-8")
    section = doc.split("## Examples", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert len(rows) >= 8
    text = ""
    for row in rows:
        mode_cell, text_cell, segments_cell = (c.strip() for c in row.strip("|").split("|"))
        if text_cell != "same":
            text = text_cell.strip("`")
        expected = [s.strip().strip("`") for s in segments_cell.split("·")]
        assert run(text, mode_cell.strip("`")) == expected, row  # type: ignore[arg-type]
