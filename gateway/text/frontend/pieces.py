"""Pieces: the spoken text under construction, each piece tied to the client
text it came from, so every rewrite keeps an exact span map.

A :class:`Piece` is either *copied* (its text is the source slice, character
for character) or *rewritten* (atomic: any part of it maps to its whole
source range).  Silent source text (markup) is a piece with empty text.
``frozen`` pieces are final (inline code, an engine tag, a lexicon alias, a
normalized number): later rewriting stages leave them alone.

:func:`rewrite` runs one stage (lexicon, emoji, normalization) over every run
of consecutive unfrozen pieces: the stage sees the run's text and returns the
``(start, end, replacement)`` edits it wants; the pieces are re-cut around
them.  Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gateway.text.frontend.types import Span, SpokenSegment

__all__ = ["Edit", "Piece", "rewrite", "to_segment"]

#: ``(start, end, replacement)`` in a run's text; non-overlapping, in order.
Edit = tuple[int, int, str]


@dataclass(frozen=True, slots=True)
class Piece:
    text: str
    source_start: int
    source_end: int
    copied: bool = True
    frozen: bool = False
    pause_ms: int = 0  # an SSML <break>: silence before what follows


def rewrite(pieces: list[Piece], stage: Callable[[str], Iterable[Edit]]) -> list[Piece]:
    """Apply ``stage`` to each run of unfrozen pieces."""
    out: list[Piece] = []
    run: list[Piece] = []
    for piece in pieces:
        if piece.frozen:
            out.extend(_rewrite_run(run, stage))
            run = []
            out.append(piece)
        else:
            run.append(piece)
    out.extend(_rewrite_run(run, stage))
    return out


def _rewrite_run(run: list[Piece], stage: Callable[[str], Iterable[Edit]]) -> list[Piece]:
    if not run:
        return []
    text = "".join(p.text for p in run)
    edits = list(stage(text)) if text else []
    if not edits:
        return run
    starts: list[int] = []
    pos = 0
    for p in run:
        starts.append(pos)
        pos += len(p.text)
    used = [False] * len(run)  # silent pieces are placed once
    out: list[Piece] = []
    cursor = 0
    for start, end, replacement in edits:
        out.extend(_slice(run, starts, used, cursor, start))
        lo, hi = _source_of(run, starts, used, start, end)
        out.append(Piece(replacement, lo, hi, copied=False, frozen=True))
        cursor = end
    out.extend(_slice(run, starts, used, cursor, len(text)))
    return out


def _slice(run: list[Piece], starts: list[int], used: list[bool], a: int, b: int) -> list[Piece]:
    """The pieces of the run's text ``[a, b]``, silent pieces there kept."""
    out: list[Piece] = []
    for i, (p, s) in enumerate(zip(run, starts, strict=True)):
        e = s + len(p.text)
        if not p.text:
            if a <= s <= b and not used[i]:
                used[i] = True
                out.append(p)
            continue
        lo, hi = max(a, s), min(b, e)
        if lo >= hi:
            continue
        if lo == s and hi == e:
            out.append(p)
        elif p.copied:
            off = p.source_start - s
            out.append(Piece(p.text[lo - s : hi - s], lo + off, hi + off, True, p.frozen))
        else:
            part = p.text[lo - s : hi - s]
            out.append(Piece(part, p.source_start, p.source_end, False, p.frozen))
    return out


def _source_of(
    run: list[Piece], starts: list[int], used: list[bool], a: int, b: int
) -> tuple[int, int]:
    """The source range of the run's text ``[a, b)`` (silent pieces strictly
    inside included)."""
    lo: int | None = None
    hi: int | None = None
    for i, (p, s) in enumerate(zip(run, starts, strict=True)):
        e = s + len(p.text)
        if not p.text:
            if not a < s < b or used[i]:
                continue
            used[i] = True
            ps, pe = p.source_start, p.source_end
        elif e <= a or s >= b:
            continue
        elif p.copied:
            off = p.source_start - s
            ps, pe = max(a, s) + off, min(b, e) + off
        else:
            ps, pe = p.source_start, p.source_end
        lo = ps if lo is None else min(lo, ps)
        hi = pe if hi is None else max(hi, pe)
    if lo is None or hi is None:
        point = run[-1].source_end
        for p, s in zip(run, starts, strict=True):
            if s + len(p.text) > a or (s >= a and p.text):
                point = p.source_start + (a - s if p.copied and s <= a else 0)
                break
        return point, point
    return lo, hi


def to_segment(source: str, pieces: list[Piece], *, blank_is_silent: bool = True) -> SpokenSegment:
    """The segment the pieces spell, with one span per piece (adjacent copied
    pieces that continue each other are merged) and the pauses of breaks.
    Spoken text of whitespace only is "" (nothing to speak) when
    ``blank_is_silent``."""
    spans: list[Span] = []
    pauses: list[tuple[int, int]] = []
    parts: list[str] = []
    pos = 0
    for p in pieces:
        if p.pause_ms:
            pauses.append((pos, p.pause_ms))
        end = pos + len(p.text)
        prev = spans[-1] if spans else None
        if (
            prev is not None
            and p.copied
            and p.text
            and prev.spoken_end == pos
            and prev.source_end == p.source_start
            and prev.spoken_end - prev.spoken_start == prev.source_end - prev.source_start
            and prev.spoken_end > prev.spoken_start
        ):
            spans[-1] = Span(prev.spoken_start, end, prev.source_start, p.source_end)
        else:
            spans.append(Span(pos, end, p.source_start, p.source_end))
        parts.append(p.text)
        pos = end
    text = "".join(parts)
    if blank_is_silent and text and text.isspace():
        # nothing to speak (a code block, a rule): the segment is silent
        spans = [Span(0, 0, s.source_start, s.source_end) for s in spans]
        pauses = [(0, ms) for _, ms in pauses]
        text = ""
    return SpokenSegment(source=source, text=text, spans=tuple(spans), pauses=tuple(pauses))
