"""The Markdown reader and emoji: tables of written -> spoken, carried state
across segments, span maps, and the plain identity."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.text.frontend import FrontEnd, FrontEndOptions
from tests.text.spans import check_spans

MARKDOWN: list[tuple[str, str]] = [
    # headings
    ("# Heading", "Heading."),
    ("## Step two", "Step two."),
    ("### Done!", "Done!"),
    ("# Title #", "Title."),
    ("#hashtag", "#hashtag"),
    # emphasis
    ("**Step 1:** Open the app.", "Step 1: Open the app."),
    ("Hi **Frankie**!", "Hi Frankie!"),
    ("*really* good", "really good"),
    ("_really_ good", "really good"),
    ("__bold__ move", "bold move"),
    ("***both*** here", "both here"),
    ("**bold *and italic* too**", "bold and italic too"),
    ("~~gone~~ text", "gone text"),
    ("not **closed here", "not closed here"),
    # left alone
    ("x**2", "x**2"),
    ("*.py files", "*.py files"),
    ("2 * 3", "2 * 3"),
    ("x = y * 2", "x = y * 2"),
    ("snake_case and my_var", "snake_case and my_var"),
    ("a*b*c", "a*b*c"),
    ("5 * 4 * 3", "5 * 4 * 3"),
    ("file_name_here.txt", "file_name_here.txt"),
    # inline code
    ("Run `pip install foo` now.", "Run pip install foo now."),
    ("Use ``a`b`` here", "Use a`b here"),
    ("a stray ` tick", "a stray  tick"),
    # links and images
    ("See [the docs](https://example.com/docs/setup).", "See the docs."),
    ("[**bold link**](http://x.y)", "bold link"),
    ("A [ref link][1] here", "A ref link here"),
    ("[1]: https://example.com", ""),
    ("![a cat](cat.png)", "a cat"),
    ("![](empty.png) after", " after"),
    ("<https://example.com/a>", "https://example.com/a"),
    ("[not a link] alone", "[not a link] alone"),
    # lists
    ("- item one", "item one."),
    ("* item two", "item two."),
    ("+ item three", "item three."),
    ("1. First step", "First step."),
    ("2) Second step", "Second step."),
    ("- [ ] todo", "todo."),
    ("- [x] done", "done."),
    ("- ends with a dot.", "ends with a dot."),
    ("- one\n- two", "one.\ntwo."),
    ("  - nested", "nested."),
    # block quotes
    ("> quoted", "quoted"),
    ("> > deeper *text*", "deeper text"),
    # rules
    ("---", ""),
    ("***", ""),
    ("___", ""),
    ("- - -", ""),
    # HTML
    ("Hello <b>bold</b> text", "Hello bold text"),
    ("line<br/>break", "linebreak"),
    ("a <!-- hidden --> b", "a  b"),
    ('<div class="x">in</div>', "in"),
    # escapes
    (r"\*not emphasis\*", "*not emphasis*"),
    (r"1\. not a list", "1. not a list"),
    # tables
    ("| Name | Age |\n|---|---|\n| Alice | 30 |", "\n\nName: Alice, Age: 30."),
    ("| A | B |\n| :-- | --: |\n| 1 | 2 |\n| 3 | |", "\n\nA: 1, B: 2.\nA: 3."),
    ("| **Key** | Value |\n|-|-|\n| k | `v` |", "\n\nKey: k, Value: v."),
    # code blocks
    ("```python\nprint('hi')\n```", ""),
    ("~~~\ncode\n~~~", ""),
    ("Before.\n```\nx = 1\n```\nAfter.", "Before.\n\n\n\nAfter."),
]


def md(text: str, **options: object) -> str:
    fe = FrontEnd(FrontEndOptions(normalize=False, **options))  # type: ignore[arg-type]
    seg = fe.process(text)
    check_spans(seg)
    return seg.text


@pytest.mark.parametrize(("written", "spoken"), MARKDOWN, ids=[w for w, _ in MARKDOWN])
def test_markdown(written: str, spoken: str) -> None:
    assert md(written) == spoken


EMOJI: list[tuple[str, str, str]] = [
    ("Great job 😀👍", "drop", "Great job"),
    ("Great job 😀 👍!", "drop", "Great job!"),
    ("🎉 Done", "drop", " Done"),
    ("I ❤️ it", "drop", "I it"),
    ("family 👨‍👩‍👧 time", "drop", "family time"),
    ("thumbs 👍🏽 up", "drop", "thumbs up"),
    ("Great job 👍", "name", "Great job thumbs up"),
    ("I ❤️ it", "name", "I red heart it"),
    ("no emoji © here", "drop", "no emoji here"),
    ("plain text", "drop", "plain text"),
]


@pytest.mark.parametrize(
    ("written", "mode", "spoken"), EMOJI, ids=[f"{w}-{m}" for w, m, _ in EMOJI]
)
def test_emoji(written: str, mode: str, spoken: str) -> None:
    assert md(written, emoji=mode) == spoken


def test_keep_tags_pass_through_verbatim() -> None:
    fe = FrontEnd(FrontEndOptions(keep_tags=frozenset({"<laugh>", "sigh"})))
    assert fe.process("Oh <laugh> that **is** funny <sigh> <b>x</b>").text == (
        "Oh <laugh> that is funny <sigh> x"
    )


def segments(parts: list[str], **options: object) -> list[str]:
    fe = FrontEnd(FrontEndOptions(normalize=False, **options))  # type: ignore[arg-type]
    out = []
    for part in parts:
        seg = fe.process(part)
        check_spans(seg)
        out.append(seg.text)
    assert fe.finish() is None
    return out


def test_emphasis_opened_in_one_segment_is_closed_in_a_later_one() -> None:
    assert segments(["**Step one.", "Step two.**", "After."]) == [
        "Step one.",
        "Step two.",
        "After.",
    ]
    assert segments(["She said *this is", "true* and left."]) == [
        "She said this is",
        "true and left.",
    ]


def test_code_fence_carried_across_segments() -> None:
    assert segments(["```python", "print('a.')", "x = 1\n```", "Back to text."]) == [
        "",
        "",
        "",
        "Back to text.",
    ]


def test_table_header_carried_across_segments() -> None:
    assert segments(["| City | Temp |\n|---|---|", "| Oslo | 5 |", "| Rome | 20 |", "Done."]) == [
        "",
        "City: Oslo, Temp: 5.",
        "City: Rome, Temp: 20.",
        "Done.",
    ]
    # a line that is no row ends the table: a later row starts a new one
    assert segments(["| A |\n|-|", "Text.", "| B |"]) == ["", "Text.", ""]


def test_finish_resets_carried_state() -> None:
    fe = FrontEnd(FrontEndOptions(normalize=False))
    fe.process("```")
    assert fe.finish() is None
    assert fe.process("spoken").text == "spoken"


def test_spans_name_the_client_text() -> None:
    fe = FrontEnd(FrontEndOptions())
    seg = fe.process("**Price:** $5 at [the shop](https://x.com).")
    assert seg.text == "Price: five dollars at the shop."
    start = seg.text.index("five dollars")
    assert seg.source_range(start, start + len("five")) == (11, 13)  # "$5", atomic
    start = seg.text.index("shop")
    lo, hi = seg.source_range(start, start + 4)
    assert seg.source[lo:hi] == "shop"
    lo, hi = seg.source_range(0, len("Price:"))
    assert seg.source[lo:hi] == "Price:"
    assert seg.source_range(0, len(seg.text)) == (2, len(seg.source))


@given(st.text(max_size=200))
def test_plain_without_normalization_is_the_identity(text: str) -> None:
    fe = FrontEnd(FrontEndOptions(input_format="plain", normalize=False))
    seg = fe.process(text)
    assert seg.text == text
    assert seg.source == text
    if text:
        assert len(seg.spans) == 1
        assert (seg.spans[0].spoken_start, seg.spans[0].spoken_end) == (0, len(text))
        assert (seg.spans[0].source_start, seg.spans[0].source_end) == (0, len(text))


MD_ALPHABET = "ab *_`[]()!#|-~<>\\\n.1$😀"


@given(st.text(alphabet=MD_ALPHABET, max_size=120), st.booleans())
def test_any_markdown_reads_with_a_consistent_span_map(text: str, normalize: bool) -> None:
    fe = FrontEnd(FrontEndOptions(normalize=normalize))
    for part in (text, text[::-1]):
        check_spans(fe.process(part))
    fe.finish()


def test_a_long_table_repeats_its_header_names_a_bounded_number_of_rows() -> None:
    """Issue 28: a 250-character header over 3,000 one-cell rows read 42x
    the table's text.  The header names are repeated for the first rows
    only, and a header too long to repeat is read once."""
    from gateway.text.frontend.markdown import MAX_HEADER_CHARS, MAX_NAMED_ROWS

    rows = [f"| {i} |" for i in range(MAX_NAMED_ROWS + 2)]
    spoken = segments(["| N |\n|---|", *rows])
    assert spoken[1] == "N: 0." and spoken[MAX_NAMED_ROWS] == f"N: {MAX_NAMED_ROWS - 1}."
    assert spoken[MAX_NAMED_ROWS + 1] == f"{MAX_NAMED_ROWS}."

    header = "word " * 50  # 250 characters
    assert len(header.strip()) > MAX_HEADER_CHARS
    table = f"| {header} |\n|---|\n" + "".join(f"| r{i} |\n" for i in range(3000))
    fe = FrontEnd(FrontEndOptions(normalize=False))
    total = 0
    for segment in run_segments(table):
        seg = fe.process(segment)
        check_spans(seg)
        total += len(seg.text)
    assert total <= len(table)  # was 42x
    fe = FrontEnd(FrontEndOptions(normalize=False))
    assert fe.process(f"| {header} | B |").text == header.strip() + ", B."
    assert fe.process("| x | y |").text == "x, y."


def run_segments(text: str) -> list[str]:
    from gateway.text.segmenter import Segmenter

    seg = Segmenter("auto", input_format="markdown")
    return seg.push(text) + seg.flush()


def test_unclosed_openers_are_silent_however_many() -> None:
    """Issue 28: past the eighth carried opener, ``*a *a ...`` reached the
    engine with its asterisks."""
    assert md("*a " * 20).split() == ["a"] * 20
    assert md("2 * 3 and x**2 and *.py") == "2 * 3 and x**2 and *.py"


@pytest.mark.parametrize(
    ("line", "spoken"),
    [
        ("[1]: https://example.com/a", ""),
        ('[r2]: https://e.co/2 "The title"', ""),
        ("[r3]: <https://e.co/3> (title)", ""),
        # not a definition: a sentence after the label, read
        ("[Note]: read this first.", "[Note]: read this first."),
    ],
)
def test_link_reference_definitions_are_silent_and_only_they(line: str, spoken: str) -> None:
    assert md(line) == spoken
