"""The front-end on any text (issue 28): whatever the client sends, in every
input format and with every option, it reads it or refuses it with its one
documented error (:class:`FrontEndError`, SSML only), and its report holds:
spans in order, complete, and on the client's text.

Text is drawn from all of Unicode and, to reach the constructs often, from
an alphabet of markup, digits of every form, invisible characters and emoji.
The number of examples is bounded so this runs in a few seconds (it is part
of the README's test command).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.text.frontend import FrontEnd, FrontEndError, FrontEndOptions, SpokenSegment
from gateway.text.segmenter import Segmenter
from tests.text.spans import check_spans

MARKUP = (
    "ab Z9 0123456789.,:;!?-–—/%$€£#&*_`~[]()!<>|\\\"'\n\t²①٣３½¼\u200b\u200d\u00ad\ufeff👍🏽👨‍👩‍👧"
)
SNIPPETS = st.sampled_from(
    [
        "<speak>", "</speak>", '<say-as interpret-as="digits">', '<say-as interpret-as="date">',
        '<say-as interpret-as="characters">', "</say-as>", '<sub alias="a b">', "</sub>",
        '<break time="1s"/>', "&amp;", "&#x4E2D;", "&#9999999;", "&nbsp;", "<!DOCTYPE x>",
        "<laugh>", "**", "```", "| a | b |\n|---|---|\n", "[r1]: https://e.co/1\n", "[t](u)",
        "https://x.co/a²", "$1,234.56", "2026-12-01", "5--10", "-5", "1\u200d000", "# H\n",
        "- item\n", "> q\n", "qq ", "e.g. ", "Dr. ",
    ]
)  # fmt: skip
TEXT = st.lists(
    st.one_of(st.text(max_size=30), st.text(alphabet=MARKUP, max_size=30), SNIPPETS),
    max_size=8,
).map("".join)
OPTIONS = st.builds(
    FrontEndOptions,
    input_format=st.sampled_from(["markdown", "plain", "ssml"]),
    normalize=st.booleans(),
    emoji=st.sampled_from(["drop", "name"]),
    language=st.sampled_from(["en", "en-US", "de", "xx"]),
    pronunciations=st.sampled_from(
        [(), (("qq", "alpha bravo"),), (("a", "the letter a"), ("US", "you ess"), ("5", "five"))]
    ),
    keep_tags=st.sampled_from([frozenset(), frozenset({"laugh", "sigh"})]),
    engine_normalizes=st.booleans(),
)


def check_report(seg: SpokenSegment) -> None:
    """In order and complete (``check_spans``), every source character
    accounted for by a span, and each spoken word on the client's text."""
    check_spans(seg)
    covered = [False] * len(seg.source)
    for span in seg.spans:
        for i in range(span.source_start, span.source_end):
            covered[i] = True
    assert all(covered) or not seg.source.strip(), seg
    last = 0
    for word_start, word_end in _words(seg.text):
        lo, hi = seg.source_range(word_start, word_end)
        assert 0 <= lo <= hi <= len(seg.source), (seg, word_start)
        assert hi >= last or lo <= last, seg  # words do not go backwards
        last = max(last, lo)


def _words(text: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    start = None
    for i, ch in enumerate(text + " "):
        if ch.isspace():
            if start is not None:
                out.append((start, i))
            start = None
        elif start is None:
            start = i
    return out


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT, OPTIONS, st.integers(8, 300), st.integers(1, 40))
def test_any_text_is_read_or_refused_with_the_documented_error(
    text: str, options: FrontEndOptions, max_chars: int, chunk: int
) -> None:
    segmenter = Segmenter("auto", max_chars=max_chars, input_format=options.input_format)
    segments: list[str] = []
    for i in range(0, len(text), chunk):
        segments += segmenter.push(text[i : i + chunk])
    segments += segmenter.flush()
    fe = FrontEnd(options)
    read = 0
    for segment in segments:
        try:
            seg = fe.process(segment)
        except FrontEndError as exc:  # malformed SSML: refused at a position
            assert options.input_format == "ssml"
            assert read <= exc.position <= read + len(segment)
            if exc.spoken is not None:
                check_report(exc.spoken)
            return  # the utterance's later text is not read (as the session does)
        assert seg.source == segment
        check_report(seg)
        read += len(segment)
    try:
        fe.finish()
    except FrontEndError as exc:
        assert options.input_format == "ssml" and exc.position == read
