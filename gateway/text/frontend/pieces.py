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
    """One pass over the run's pieces and the stage's edits (both in order)."""
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
    out: list[Piece] = []
    n = len(run)
    k = 0  # the current piece
    off = 0  # characters of it already placed
    for a, b, replacement in edits:
        # the text before the edit, silent pieces at its start included
        while k < n:
            p, s = run[k], starts[k]
            e = s + len(p.text)
            if not p.text:
                if s > a:
                    break
                out.append(p)
            elif e <= a:
                out.append(p if off == 0 else _part(p, s, s + off, e))
            else:
                if s + off < a:
                    out.append(_part(p, s, s + off, a))
                    off = a - s
                break
            k, off = k + 1, 0
        # the edited text: its source range (silent pieces strictly inside)
        lo: int | None = None
        hi: int | None = None
        point = _point(run, starts, k, off)
        while k < n:
            p, s = run[k], starts[k]
            e = s + len(p.text)
            if not p.text:
                if s >= b:
                    break
                ps, pe = p.source_start, p.source_end
            elif s + off >= b:
                break
            elif p.copied:
                ps = p.source_start + off
                pe = p.source_start + min(e, b) - s
            else:
                ps, pe = p.source_start, p.source_end
            lo = ps if lo is None else min(lo, ps)
            hi = pe if hi is None else max(hi, pe)
            if p.text and e > b:
                off = b - s
                break
            k, off = k + 1, 0
        if lo is None or hi is None:
            lo = hi = point
        out.append(Piece(replacement, lo, hi, copied=False, frozen=True))
    while k < n:
        p, s = run[k], starts[k]
        out.append(p if off == 0 else _part(p, s, s + off, s + len(p.text)))
        k, off = k + 1, 0
    return out


def _part(p: Piece, s: int, x: int, y: int) -> Piece:
    """The part ``[x, y)`` (run-text offsets) of piece ``p`` starting at ``s``."""
    if p.copied:
        return Piece(
            p.text[x - s : y - s], p.source_start + x - s, p.source_start + y - s, True, p.frozen
        )
    return Piece(p.text[x - s : y - s], p.source_start, p.source_end, False, p.frozen)


def _point(run: list[Piece], starts: list[int], k: int, off: int) -> int:
    """The source position of the current place in the run."""
    if k >= len(run):
        return run[-1].source_end
    p = run[k]
    return p.source_start + off if p.copied and p.text else p.source_start


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
