"""Streaming: hold_back, the segmenter's Markdown and SSML rules, and the
property that any split of a reply into tokens is spoken as the reply sent
whole.  Also the lexicon."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.text.frontend import FrontEnd, FrontEndOptions, InputFormat, hold_back
from gateway.text.frontend.holdback import WINDOW
from gateway.text.frontend.lexicon import LexiconError, load_lexicon, parse_lexicon
from gateway.text.segmenter import Segmenter
from tests.text.spans import check_spans

HOLD: list[tuple[str, InputFormat, int]] = [
    # text, format, index held from (len(text): nothing held)
    ("Hello there.", "markdown", 12),
    ("Say **hello", "markdown", 4),
    ("Say **hello** now", "markdown", 17),
    ("Say *", "markdown", 4),
    ("Say **", "markdown", 4),
    ("x**2 and more", "markdown", 13),
    ("a *.py file", "markdown", 11),
    ("2 * 3 is six", "markdown", 12),
    ("snake_case and my_var", "markdown", 21),
    ("run `pip", "markdown", 4),
    ("run `pip` now", "markdown", 13),
    ("see [the docs", "markdown", 4),
    ("see [the docs]", "markdown", 4),
    ("see [the docs](https://exa", "markdown", 4),
    ("see [the docs](https://example.com) ok", "markdown", 38),
    ("an ![image", "markdown", 3),
    ("a <b", "markdown", 2),
    ("a < b", "markdown", 5),
    ("ends with \\", "markdown", 10),
    ("[a] b", "markdown", 5),
    ("Say <brea", "ssml", 4),
    ('Say <break time="1s"/> ok', "ssml", 25),
    ("Fish &am", "ssml", 5),
    ("Fish & chips", "ssml", 12),
    ('<say-as interpret-as="digits">12', "ssml", 0),
    ('<say-as interpret-as="digits">12</say-as>', "ssml", 41),
    ("Say **hello", "plain", 11),
]


@pytest.mark.parametrize(("text", "fmt", "held"), HOLD, ids=[f"{t}-{f}" for t, f, _ in HOLD])
def test_hold_back(text: str, fmt: InputFormat, held: int) -> None:
    assert hold_back(text, fmt) == held


def test_hold_back_looks_back_a_bounded_window() -> None:
    opened = "Say **hello " + "word " * 10
    assert hold_back(opened, "markdown") == 4
    long = "Say **hello " + "word " * (WINDOW // 5 + 1)
    assert hold_back(long, "markdown") == len(long)
    stray = "x * y " + "and more words. " * 20
    assert hold_back(stray, "markdown") == len(stray)


def run(chunks: list[str], fmt: InputFormat = "markdown", max_chars: int = 300) -> list[str]:
    seg = Segmenter("auto", max_chars=max_chars, input_format=fmt)
    out: list[str] = []
    for chunk in chunks:
        out += seg.push(chunk)
    return out + seg.flush()


def test_no_cut_inside_open_emphasis_until_it_closes() -> None:
    seg = Segmenter("sentence", input_format="markdown")
    assert seg.push("Say **hello. Wor") == []
    assert seg.push("ld** now. Next") == ["Say **hello.", "World** now."]
    plain = Segmenter("sentence")
    assert plain.push("Say **hello. Wor") == ["Say **hello."]


def test_no_cut_inside_an_open_ssml_tag() -> None:
    seg = Segmenter("sentence", input_format="ssml")
    # "Two." waits: a tag's attributes are markup, so nothing speakable is
    # known to follow it yet (else what follows would merge into it)
    assert seg.push('One. Two. <sub alias="Hi.') == ["One."]
    assert seg.push(' There">Y</sub> three. Four') == [
        "Two.",
        '<sub alias="Hi. There">Y</sub> three.',
    ]
    assert run(['<sub alias="Hi. There">Y</sub> three. Four'], fmt="ssml") == [
        '<sub alias="Hi. There">Y</sub> three.',
        "Four",
    ]


def test_an_ssml_break_ends_a_segment() -> None:
    """Its pause is heard where it stands: at the end of the words before it
    (a break with nothing speakable before it stays with what follows)."""
    text = '<speak><break/>Hi there <BREAK time="1.5s" /> my friend, ok? Fine.</speak>'
    assert run([text], fmt="ssml") == [
        '<speak><break/>Hi there <BREAK time="1.5s" />',
        "my friend, ok?",
        "Fine.</speak>",
    ]
    seg = Segmenter("sentence", input_format="ssml")
    assert seg.push('One <break time="1.') == []  # inside the tag: no cut
    assert seg.push('5s"/>') == []  # what follows is not known yet
    assert seg.push(" two") == ['One <break time="1.5s"/>']


def test_markdown_lines_are_boundaries() -> None:
    text = "# Title\nSome text here\nmore text.\n- one\n- two\n\nPara"
    assert run([text], max_chars=300) == [
        "# Title",
        "Some text here\nmore text.",
        "- one",
        "- two",
        "Para",
    ]
    assert run(["Plain line\nnext line"], fmt="plain") == ["Plain line\nnext line"]


def test_no_clause_cut_between_numbers() -> None:
    assert run(["It runs January 15, 2025 to May, then stops."], fmt="plain") == [
        "It runs January 15, 2025 to May,",
        "then stops.",
    ]


def test_a_table_row_is_one_segment() -> None:
    text = "| Name | Note |\n|---|---|\n| Al | Hi. Bye. |\n| Bo | Yes! |\nDone."
    assert run([text]) == [
        "| Name | Note |\n|---|---|",
        "| Al | Hi. Bye. |",
        "| Bo | Yes! |",
        "Done.",
    ]


def test_a_long_code_block_is_cut_by_the_cap() -> None:
    code = "```\n" + "x = 1 + 2 + 3 + 4 + 5\n" * 10 + "```\nAfter."
    segments = run([code], max_chars=60)
    assert all(len(s) <= 60 for s in segments)
    fe = FrontEnd(FrontEndOptions())
    assert [fe.process(s).text for s in segments][-1] == "After."
    assert all(
        fe2 == "" for fe2 in [FrontEnd(FrontEndOptions()).process(s).text for s in segments[:1]]
    )


REPLY_PARTS = st.sampled_from(
    [
        "# Heading\n",
        "**Step 1:** Open the app. ",
        "Hi **Frankie**! ",
        "*emphasis across. two sentences* ",
        "See [the docs](https://example.com/docs/setup). ",
        "![alt text](img.png) ",
        "- item one\n",
        "1. first\n",
        "> quoted line\n",
        "| A | B |\n|---|---|\n| 1 | 2 |\n",
        "```\ncode. here\n```\n",
        "---\n",
        "Price $1,234.56 on 2026-12-01. ",
        "Call 555-123-4567 now. ",
        "x**2 and 2 * 3 and snake_case. ",
        "Great job 😀👍 ",
        "Use `pip install x`. ",
        "e.g. Mr. Smith at 3:45 PM. ",
        "Ok.\n\n",
        "<b>bold</b> <laugh> fine. ",
    ]
)


def token_split(reply: str, data: st.DataObject) -> list[str]:
    """``reply`` cut at up to 40 drawn places, as an LLM's tokens arrive."""
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(reply) - 1)), max_size=40)))
    return [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True) if b > a]


@settings(max_examples=150, deadline=None)
@given(st.lists(REPLY_PARTS, min_size=1, max_size=12), st.data())
def test_any_token_split_speaks_as_the_reply_sent_whole(
    parts: list[str], data: st.DataObject
) -> None:
    reply = "".join(parts)
    tokens = token_split(reply, data)
    options = FrontEndOptions(keep_tags=frozenset({"laugh"}))

    def spoken(chunks: list[str]) -> str:
        fe = FrontEnd(options)
        out = []
        for segment in run(chunks, max_chars=80):
            seg = fe.process(segment)
            check_spans(seg)
            out.append(seg.text)
        fe.finish()
        return " ".join(out)

    assert spoken(tokens) == spoken([reply])


def test_lexicon_whole_word_longest_first_and_case_rules() -> None:
    options = FrontEndOptions(
        input_format="plain",
        pronunciations=(
            ("nginx", "engine x"),
            ("New York", "Noo York"),
            ("New York City", "the city"),
            ("US", "you ess"),
        ),
    )
    fe = FrontEnd(options)
    assert fe.process("NGINX in New York City, New York and the US, us").text == (
        "engine x in the city, Noo York and the you ess, us"
    )
    assert fe.process("nginxes").text == "nginxes"


def test_lexicon_before_normalization_and_later_entries_win() -> None:
    fe = FrontEnd(FrontEndOptions(pronunciations=(("3M", "three em"), ("3M", "Three M"))))
    assert fe.process("**3M** has 3 sites").text == "Three M has three sites"


def test_lexicon_file(tmp_path: object) -> None:
    assert parse_lexicon("# comment\n\nnginx\tengine x\nSQL\tsequel\n") == (
        ("nginx", "engine x"),
        ("SQL", "sequel"),
    )
    with pytest.raises(LexiconError, match="line 2"):
        parse_lexicon("ok\tfine\nbroken line\n")
    from pathlib import Path

    path = Path(str(tmp_path)) / "lexicon.tsv"
    path.write_text("kubectl\tcube control\n", encoding="utf-8")
    assert load_lexicon(path) == (("kubectl", "cube control"),)
    with pytest.raises(LexiconError, match="cannot read"):
        load_lexicon(path.with_name("missing.tsv"))


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="ab A*_`[]()!#|-<>&;\n.,:1 ", max_size=150),
    st.sampled_from(["markdown", "ssml"]),
    st.integers(20, 120),
    st.data(),
)
def test_segments_do_not_depend_on_the_chunking(
    text: str, fmt: InputFormat, max_chars: int, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=30)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if b > a]
    whole = run([text], fmt=fmt, max_chars=max_chars)
    assert run(chunks, fmt=fmt, max_chars=max_chars) == whole
    assert "".join(whole).replace(" ", "").replace("\n", "") == text.replace(" ", "").replace(
        "\n", ""
    )


SSML_PARTS = st.sampled_from(
    [
        "<speak>",
        "Hello there. ",
        '<break time="300ms"/>',
        '<sub alias="World Wide Web">WWW</sub> is big. ',
        '<say-as interpret-as="characters">ABC</say-as>. ',
        "Fish &amp; chips. ",
        "<p>One. Two.</p>",
        "It costs $5. ",
    ]
)


@settings(max_examples=100, deadline=None)
@given(st.lists(SSML_PARTS, min_size=1, max_size=10), st.data())
def test_any_token_split_of_ssml_speaks_as_sent_whole(
    parts: list[str], data: st.DataObject
) -> None:
    reply = "".join(parts) + ("</speak>" if "<speak>" in parts else "")
    reply = (
        reply.replace("<speak>", "", reply.count("<speak>") - 1)
        if reply.count("<speak>") > 1
        else reply
    )
    tokens = token_split(reply, data)

    def spoken(chunks: list[str]) -> tuple[str, list[tuple[int, int]]]:
        fe = FrontEnd(FrontEndOptions(input_format="ssml"))
        texts: list[str] = []
        pauses: list[tuple[int, int]] = []
        for segment in run(chunks, fmt="ssml", max_chars=80):
            seg = fe.process(segment)
            check_spans(seg)
            texts.append(seg.text)
            pauses += list(seg.pauses)
        fe.finish()
        return " ".join(texts), pauses

    assert spoken(tokens) == spoken([reply])


# --- issue 28: cuts that split what the front-end reads as one piece ---------------


def read_all(text: str, fmt: InputFormat, chunks: int = 1) -> list[str]:
    """``text`` pushed in ``chunks`` pieces, cut, and read segment by segment."""
    size = max(1, len(text) // chunks)
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    fe = FrontEnd(FrontEndOptions(input_format=fmt))
    spoken = []
    for segment in run(pieces, fmt=fmt):
        seg = fe.process(segment)
        check_spans(seg)
        spoken.append(seg.text)
    fe.finish()
    return spoken


@pytest.mark.parametrize("chunks", [1, 7, 100])
def test_the_cap_never_cuts_inside_a_character_reference(chunks: int) -> None:
    text = "<speak>" + "&#x4E2D;&#x6587;" * 30 + " ok.</speak>"
    assert "".join(read_all(text, "ssml", chunks)) == "中文" * 30 + " ok."


@pytest.mark.parametrize("chunks", [1, 7, 100])
def test_the_cap_never_cuts_inside_a_tag_a_long_alias_keeps_its_spaces(chunks: int) -> None:
    alias = "World Wide Web " * 20
    text = '<speak>Say <sub alias="' + alias + '">WWW</sub> ok.</speak>'
    spoken = " ".join(s.strip() for s in read_all(text, "ssml", chunks) if s.strip())
    assert spoken == "Say " + alias.strip() + " ok."


def test_a_tag_that_never_ends_is_cut_by_the_cap_and_refused() -> None:
    seg = Segmenter("sentence", input_format="ssml")
    # before the tag; then the tag waits for its end
    assert seg.push('<speak><sub alias="' + "x " * 400) == ["<speak>"]
    cut = seg.push("y " * 200)  # past the longest tag: cut by the cap
    assert cut and all(len(c) <= 300 for c in cut)


@pytest.mark.parametrize("chunks", [1, 13])
def test_link_reference_definitions_are_whole_lines_and_silent(chunks: int) -> None:
    text = "".join(f"[r{i}]: https://e.co/{i}\n" for i in range(40)) + "Done."
    size = len(text) // chunks + 1
    segments = run([text[i : i + size] for i in range(0, len(text), size)])
    assert segments[:2] == ["[r0]: https://e.co/0", "[r1]: https://e.co/1"]
    assert "".join(read_all(text, "markdown", chunks)) == "Done."
    assert hold_back("See.\n[r0]: https://e.c", "markdown") == 5
