"""The front-end's value types: options, spans, the spoken segment, the error.

Pure data; no parsing here.  A :class:`SpokenSegment` pairs the client's
committed text (``source``) with what the engine reads (``text``) and the
exact map between the two (``spans``), so word timings and cancel reports
can be given on the client's text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal, get_args

__all__ = [
    "INPUT_FORMATS",
    "FrontEndError",
    "FrontEndOptions",
    "InputFormat",
    "Span",
    "SpokenSegment",
]

InputFormat = Literal["markdown", "plain", "ssml"]
INPUT_FORMATS: Final[tuple[str, ...]] = get_args(InputFormat)


@dataclass(frozen=True)
class FrontEndOptions:
    """How one utterance's text is read.

    ``pronunciations`` is the merged lexicon (server file, then session and
    request aliases: later entries win); ``keep_tags`` names the engine's own
    markup (``laugh`` or ``<laugh>``) that passes through verbatim;
    ``engine_normalizes`` turns normalization off whatever ``normalize`` says
    (the engine reads digits itself) but keeps Markdown and emoji handling.
    """

    input_format: InputFormat = "markdown"
    normalize: bool = True
    emoji: Literal["drop", "name"] = "drop"
    language: str = "en"
    pronunciations: tuple[tuple[str, str], ...] = ()
    keep_tags: frozenset[str] = field(default_factory=frozenset)
    engine_normalizes: bool = False


@dataclass(frozen=True)
class Span:
    """One piece of spoken text and the client text it came from.

    ``spoken_start``/``spoken_end`` are offsets into :attr:`SpokenSegment.text`,
    ``source_start``/``source_end`` into :attr:`SpokenSegment.source`.  A
    rewritten piece (``$5`` -> ``five dollars``) is one span: it is atomic.
    A span with an empty spoken range marks source text that is not spoken.
    """

    spoken_start: int
    spoken_end: int
    source_start: int
    source_end: int


@dataclass(frozen=True)
class SpokenSegment:
    """A committed segment and its spoken form."""

    source: str
    text: str
    spans: tuple[Span, ...]
    pauses: tuple[tuple[int, int], ...] = ()

    def source_range(self, spoken_start: int, spoken_end: int) -> tuple[int, int]:
        """The client-text range ``[start, end)`` the spoken range came from.

        Every span that overlaps the spoken range contributes its whole source
        range (rewritten pieces are atomic).  A span whose source and spoken
        lengths are equal (text copied through) is mapped character for
        character, so a word inside a long verbatim stretch maps to itself.
        An empty range maps to the source position where it falls.
        """
        if spoken_end < spoken_start:
            spoken_start, spoken_end = spoken_end, spoken_start
        start: int | None = None
        end: int | None = None
        for span in self.spans:
            if span.spoken_end <= spoken_start and not (
                span.spoken_start == span.spoken_end == spoken_start
            ):
                continue
            if span.spoken_start >= spoken_end and spoken_end > spoken_start:
                break
            if span.spoken_start == span.spoken_end and spoken_end > spoken_start:
                continue  # silent source text inside the range: not heard
            s, e = _clip(span, spoken_start, spoken_end)
            start = s if start is None else min(start, s)
            end = e if end is None else max(end, e)
        if start is None or end is None:
            point = self._source_point(spoken_start)
            return point, point
        return start, end

    def _source_point(self, spoken: int) -> int:
        for span in self.spans:
            if spoken <= span.spoken_start:
                return span.source_start
            if spoken < span.spoken_end:
                s, _ = _clip(span, spoken, spoken + 1)
                return s
        return len(self.source)


def _clip(span: Span, spoken_start: int, spoken_end: int) -> tuple[int, int]:
    """The source range of the part of ``span`` in the spoken range."""
    spoken_len = span.spoken_end - span.spoken_start
    if spoken_len != span.source_end - span.source_start or spoken_len == 0:
        return span.source_start, span.source_end
    lo = max(spoken_start, span.spoken_start) - span.spoken_start
    hi = min(spoken_end, span.spoken_end) - span.spoken_start
    return span.source_start + lo, span.source_start + max(hi, lo)


class FrontEndError(ValueError):
    """Malformed input (SSML): ``position`` is the offset in the utterance's
    client text (all segments so far, joined) where the problem was found;
    ``spoken`` is what the failing segment held that was valid before it."""

    def __init__(self, message: str, position: int, *, spoken: SpokenSegment | None = None) -> None:
        super().__init__(f"{message} (at character {position})")
        self.message = message
        self.position = position
        self.spoken = spoken
