"""Span map checks shared by the front-end tests."""

from __future__ import annotations

from gateway.text.frontend import SpokenSegment


def check_spans(seg: SpokenSegment) -> None:
    """The span map is complete and consistent: spans in order, covering the
    spoken text without gaps, source ranges inside the source and in order,
    and a copied span (equal lengths, as written) names its own text."""
    pos = 0
    last_source = 0
    for span in seg.spans:
        assert span.spoken_start == pos, (seg, span)
        assert span.spoken_end >= span.spoken_start
        assert 0 <= span.source_start <= span.source_end <= len(seg.source), (seg, span)
        assert span.source_start >= last_source or span.source_end <= span.source_start, (seg, span)
        last_source = max(last_source, span.source_start)
        pos = span.spoken_end
    assert pos == len(seg.text), seg
    for start in range(len(seg.text)):
        lo, hi = seg.source_range(start, start + 1)
        assert 0 <= lo <= hi <= len(seg.source)
    if seg.text:
        lo, hi = seg.source_range(0, len(seg.text))
        assert 0 <= lo <= hi <= len(seg.source)
