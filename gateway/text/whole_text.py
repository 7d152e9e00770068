"""A whole text cut into segments as a stream of it would be: the HTTP
API's input (``gateway.http.synthesis``) and the tests' reference cuts.
Pure."""

from __future__ import annotations

from gateway.text.frontend import InputFormat
from gateway.text.segmenter import Segmenter, is_speakable


def committed_segments(
    text: str,
    max_chars: int,
    input_format: InputFormat | None = None,
    markup_tags: tuple[str, ...] = (),
) -> list[str]:
    """A whole text cut into segments as a stream of it would be (the HTTP
    API's input, read by the front-end: a code fence alone is a segment)."""
    segmenter = Segmenter(
        "auto", max_chars=max_chars, input_format=input_format, markup_tags=markup_tags
    )
    pieces = segmenter.push(text) + segmenter.flush()
    return [p.strip() for p in pieces if p.strip()]


def speakable_segments(text: str, max_chars: int) -> list[str]:
    """A whole text cut into speakable segments, read as written."""
    return [p for p in committed_segments(text, max_chars) if is_speakable(p)]
