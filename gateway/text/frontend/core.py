"""The per-utterance front-end: dispatch by input format, carried state.

Skeleton: identity behaviour (the segment is spoken as written, one span).
"""

from __future__ import annotations

from gateway.text.frontend.types import FrontEndOptions, InputFormat, Span, SpokenSegment

__all__ = ["FrontEnd", "hold_back"]


class FrontEnd:
    """One per utterance (per context); carries state across segments: open
    emphasis, code fence, table, list, SSML tag stack.  Pure, no I/O."""

    def __init__(self, options: FrontEndOptions) -> None:
        self.options = options
        self._offset = 0  # client characters of the utterance seen so far

    def process(self, segment: str) -> SpokenSegment:
        """The spoken form of one committed segment (may raise FrontEndError)."""
        self._offset += len(segment)
        return _identity(segment)

    def finish(self) -> SpokenSegment | None:
        """End of utterance: anything carried over, or None."""
        return None


def _identity(segment: str) -> SpokenSegment:
    if not segment:
        return SpokenSegment(source="", text="", spans=())
    whole = Span(0, len(segment), 0, len(segment))
    return SpokenSegment(source=segment, text=segment, spans=(whole,))


def hold_back(text: str, input_format: InputFormat) -> int:
    """The smallest index i such that ``text[i:]`` might be an unfinished
    Markdown construct (emphasis marker, inline code, link or image) or SSML
    tag; ``len(text)`` when nothing is open.  Looks back over a bounded window
    only.  The segmenter never commits a cut at or after this index."""
    del input_format
    return len(text)
