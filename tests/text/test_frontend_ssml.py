"""The SSML subset: tables of documents -> spoken text and pauses, errors with
their positions, tags split across segments."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.text.frontend import FrontEnd, FrontEndError, FrontEndOptions
from tests.text.spans import check_spans

SSML: list[tuple[str, str, tuple[tuple[int, int], ...]]] = [
    ("<speak>Hello there.</speak>", "Hello there.", ()),
    ("<speak><p><s>One.</s><s>Two.</s></p></speak>", "One.Two.", ()),
    ('Wait <break time="500ms"/> now', "Wait  now", ((5, 500),)),
    ('Wait <break time="1.5s"/>now', "Wait now", ((5, 1500),)),
    ('<break strength="strong"/>Go', "Go", ((0, 700),)),
    ("<break/>Go", "Go", ((0, 400),)),
    ('<break time="99s"/>Go', "Go", ((0, 10_000),)),
    ('<sub alias="World Wide Web">WWW</sub> rocks', "World Wide Web rocks", ()),
    ('<say-as interpret-as="characters">ABC</say-as>', "A B C", ()),
    ('<say-as interpret-as="spell-out">hi2</say-as>', "h i two", ()),
    ('<say-as interpret-as="digits">1234</say-as>', "one two three four", ()),
    ('<say-as interpret-as="cardinal">1,234</say-as>', "one thousand two hundred thirty four", ()),
    ('<say-as interpret-as="ordinal">3</say-as>', "third", ()),
    ('<say-as interpret-as="ordinal">21st</say-as>', "twenty first", ()),
    (
        '<say-as interpret-as="telephone">555-1234</say-as>',
        "five five five, one two three four",
        (),
    ),
    ('<say-as interpret-as="date">12/01/2026</say-as>', "December first, twenty twenty six", ()),
    (
        '<say-as interpret-as="date" format="ymd">2026-12-01</say-as>',
        "December first, twenty twenty six",
        (),
    ),
    (
        '<say-as interpret-as="date" format="dmy">01.12.2026</say-as>',
        "December first, twenty twenty six",
        (),
    ),
    ('<say-as interpret-as="date" format="md">12/25</say-as>', "December twenty fifth", ()),
    ('<say-as interpret-as="unknown">x1</say-as>', "x1", ()),
    # issue 28: digits that int() refuses (superscript, circled) were a ValueError
    ('<say-as interpret-as="digits">1\u00b2</say-as>', "one two", ()),
    ('<say-as interpret-as="characters">a\u2460</say-as>', "a one", ()),
    ('<say-as interpret-as="date">1\u00b2/01/2026</say-as>', "1\u00b2/01/2026", ()),
    ('<say-as interpret-as="cardinal">\u00b2</say-as>', "\u00b2", ()),
    ('<prosody rate="slow">kept text</prosody>', "kept text", ()),
    ('<emphasis level="strong">big</emphasis> deal', "big deal", ()),
    ("Fish &amp; chips &lt;3 &#65;&#x42;", "Fish and chips <three AB", ()),
    ("AT&amp;T", "AT&T", ()),
    ("rock & roll", "rock and roll", ()),
    ('<?xml version="1.0"?><speak>x</speak>', "x", ()),
    ("<speak>a<!-- note -->b</speak>", "ab", ()),
    ("It costs $5 <break/> today", "It costs five dollars  today", ((22, 400),)),
]


def ssml(text: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    fe = FrontEnd(FrontEndOptions(input_format="ssml"))
    seg = fe.process(text)
    check_spans(seg)
    assert fe.finish() is None
    return seg.text, seg.pauses


@pytest.mark.parametrize(("written", "spoken", "pauses"), SSML, ids=[w for w, _, _ in SSML])
def test_ssml(written: str, spoken: str, pauses: tuple[tuple[int, int], ...]) -> None:
    assert ssml(written) == (spoken, pauses)


ERRORS: list[tuple[str, int, str, str]] = [
    # document, position, message fragment, valid text before it
    ("Hi there. <b>bad</c> rest", 16, "does not close", "Hi there. bad"),
    ("<speak>ok</p>", 9, "does not close", "ok"),
    ('<!DOCTYPE speak [<!ENTITY x "y">]><speak/>', 0, "DTDs", ""),
    ("good <![CDATA[x]]>", 5, "DTDs", "good "),
    ("a &nbsp; b", 2, "unknown entity", "a "),
    ("a &#0; b", 2, "out of range", "a "),
    ("x < y and y > z", 2, "malformed tag", "x "),
    ("<speak><p a=b>x</p></speak>", 7, "malformed tag", ""),
    ("".join(f"<p{i}>" for i in range(40)), 4 * 10 + 5 * 22, "nested deeper", ""),
]


@pytest.mark.parametrize(
    ("written", "position", "message", "before"), ERRORS, ids=[e[0][:30] for e in ERRORS]
)
def test_malformed_ssml(written: str, position: int, message: str, before: str) -> None:
    fe = FrontEnd(FrontEndOptions(input_format="ssml"))
    with pytest.raises(FrontEndError) as info:
        fe.process(written)
    assert message in info.value.message
    assert info.value.position == position
    assert info.value.spoken is not None
    assert info.value.spoken.text == before
    check_spans(info.value.spoken)


def test_error_position_counts_earlier_segments() -> None:
    fe = FrontEnd(FrontEndOptions(input_format="ssml"))
    assert fe.process("<speak>One.").text == "One."
    with pytest.raises(FrontEndError) as info:
        fe.process("Two </p>")
    assert info.value.position == len("<speak>One.") + 4


def test_unfinished_document_is_an_error_at_finish() -> None:
    fe = FrontEnd(FrontEndOptions(input_format="ssml"))
    fe.process("<speak>open")
    with pytest.raises(FrontEndError, match="left open"):
        fe.finish()
    fe = FrontEnd(FrontEndOptions(input_format="ssml"))
    fe.process("cut <brea")
    with pytest.raises(FrontEndError, match="inside a tag"):
        fe.finish()


def test_tags_split_across_segments() -> None:
    fe = FrontEnd(FrontEndOptions(input_format="ssml"))
    parts = [
        '<speak>Hi <say-as interpret-as="charac',
        'ters">ab</say-as> <sub alias="X">',
        "y</sub>",
        "</speak>",
    ]
    spoken = [fe.process(p).text for p in parts]
    assert spoken == ["Hi ", "a b X", "", ""]  # the alias is spoken at <sub>
    assert fe.finish() is None


def test_say_as_split_across_segments_reads_each_part() -> None:
    fe = FrontEnd(FrontEndOptions(input_format="ssml"))
    assert fe.process('<say-as interpret-as="digits">12').text == "one two"
    assert fe.process("34</say-as>").text == "three four"


def test_sub_alias_maps_to_its_start_tag() -> None:
    fe = FrontEnd(FrontEndOptions(input_format="ssml"))
    seg = fe.process('Say <sub alias="Doctor">Dr.</sub> now')
    assert seg.text == "Say Doctor now"
    assert seg.source_range(4, 10) == (4, len('Say <sub alias="Doctor">'))


@given(st.text(alphabet='<>/ab="& ;sayp-', max_size=80))
def test_any_input_is_read_or_refused_with_a_position(text: str) -> None:
    fe = FrontEnd(FrontEndOptions(input_format="ssml"))
    try:
        check_spans(fe.process(text))
        fe.finish()
    except FrontEndError as exc:
        assert 0 <= exc.position <= len(text)


def test_engine_tags_pass_through_ssml_verbatim() -> None:
    fe = FrontEnd(FrontEndOptions(input_format="ssml", keep_tags=frozenset({"<laugh>"})))
    assert fe.process("<speak>Oh <laugh> no <sigh/></speak>").text == "Oh <laugh> no "
    assert fe.finish() is None
