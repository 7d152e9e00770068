"""Bounded work per engine item: a segment's engine text cut again, after
the front-end has expanded it, so that no work item runs on more than a
fixed amount of it.

The segmenter caps the client's text (``max_segment_chars``), but what an
engine reads is longer: the front-end expands it (a pronunciation alias,
a number read out) and so may the engine itself (espeak reads ``*`` as
"asterisk").  An engine whose cost grows faster than its input (Piper's
text encoder: 705 phoneme ids 0.33 s, 2,605 ids 7.4 s, 8,071 ids 79 s on the
2-core machine) would then run one item for seconds, and a running item
cannot be overtaken: every other session waits (``docs/engine.md``,
"Bounded work per item").

``cut_text`` splits a text into pieces, each measuring at most ``limit`` by
the engine's own ``measure`` (Piper: espeak phonemes), at the best boundary
available: between clauses first (after ``. , ; : ! ?`` and dashes followed
by a space), then between words, and only for a single word over the limit
between characters.  The pieces are the text's own characters, in order:
joined with the whitespace between them they give the text back, so the
words an engine times in them are found in the segment's text in order.

Pure: no engine, no I/O; ``measure`` is called on clauses and words, each
about once (pieces are packed by the sum of their parts' measures, plus
one for each space between them); each piece is then measured whole and,
if it came out over (a measure need not add up: espeak reads a word in
context), cut again, tighter.  So every piece measures within the limit,
joined, unless it is a single character.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["cut_ahead", "cut_text"]

#: a clause ends after punctuation followed by whitespace (kept with it)
_CLAUSE_END = re.compile(r"(?<=[.,;:!?\u2013\u2014)\]])\s+")
_WORD_END = re.compile(r"\s+")

Measure = Callable[[str], int]


def cut_text(text: str, limit: int, measure: Measure) -> list[str]:
    """``text`` as pieces each measuring at most ``limit`` (``[text]`` when
    it already does; never an empty list for a text with a non-space
    character).  ``limit`` must be at least 1; a single character measuring
    more than ``limit`` is a piece of its own (nothing can be cut smaller)."""
    if limit < 1:
        raise ValueError("limit must be >= 1")
    text = text.strip()
    if not text:
        return []
    if measure(text) <= limit:
        return [text]
    return [
        fit for piece in _cut(text, limit, measure, level=0) for fit in _fit(piece, limit, measure)
    ]


def cut_ahead(
    text: str, limit: int, measure: Measure, window: int | None = None
) -> tuple[list[str], str]:
    """The first pieces of ``text`` (as ``cut_text`` cuts them) and the rest,
    not cut yet, looking at about ``window`` characters (default four times
    ``limit``) rather than the whole text: what one work item may afford
    (the alias text of the issue, 3,014 characters, took 157 ms of espeak to
    cut whole).  Cut the rest again when its turn comes.  ``rest`` is empty
    when the pieces are the whole text."""
    text = text.strip()
    window = max(2, window or 4 * limit)
    while len(text) > window:
        edge = text.rfind(" ", 0, window)
        edge = edge if edge > 0 else window
        pieces = cut_text(text[:edge], limit, measure)
        if len(pieces) > 1:  # the last may end at the window's edge: cut it again later
            done = pieces[:-1]
            at = 0
            for piece in done:
                at = text.index(piece, at) + len(piece)
            return done, text[at:].strip()
        window *= 2
    return cut_text(text, limit, measure), ""


def _fit(piece: str, limit: int, measure: Measure) -> list[str]:
    """``piece`` as packed (its parts' measures summed within ``limit``),
    cut again tighter where it measures over the limit joined (espeak reads
    a word differently in context), until every piece is within."""
    if len(piece) <= 1 or measure(piece) <= limit:
        return [piece]
    budget = limit
    while budget > 1:
        budget = max(1, budget * 7 // 8)
        parts = _cut(piece, budget, measure, level=0)
        if len(parts) > 1:
            return [fit for part in parts for fit in _fit(part, limit, measure)]
    return _halve(piece, limit, measure)


def _split(text: str, pattern: re.Pattern[str]) -> list[str]:
    """``text`` cut after each match of ``pattern`` (the separator stays at
    the end of the part before it)."""
    parts: list[str] = []
    start = 0
    for match in pattern.finditer(text):
        if match.end() > start and match.start() > start:
            parts.append(text[start : match.end()])
            start = match.end()
    if start < len(text):
        parts.append(text[start:])
    return parts


def _cut(text: str, limit: int, measure: Measure, level: int) -> list[str]:
    """Cut ``text`` (measuring over ``limit``) at clause boundaries (level
    0), word boundaries (1) or characters (2)."""
    if level >= 2:
        return _halve(text, limit, measure)
    parts = _split(text, _CLAUSE_END if level == 0 else _WORD_END)
    if len(parts) < 2:
        return _cut(text, limit, measure, level + 1)
    pieces: list[str] = []
    current = ""
    current_size = 0
    for part in parts:
        # a part's own measure, and one more for the space after it (espeak
        # puts a word break between words measured apart: without it the
        # joined pieces came out 13 % over the limit)
        size = (measure(part.strip()) if part.strip() else 0) + (1 if part[-1].isspace() else 0)
        if size > limit:  # a part alone is too large: cut it finer
            if current.strip():
                pieces.append(current.strip())
            current, current_size = "", 0
            pieces.extend(_cut(part.strip(), limit, measure, level + 1))
            continue
        if current.strip() and current_size + size > limit:
            pieces.append(current.strip())
            current, current_size = "", 0
        current += part
        current_size += size
    if current.strip():
        pieces.append(current.strip())
    return pieces


def _halve(text: str, limit: int, measure: Measure) -> list[str]:
    """A word over the limit, cut in halves until each measures within it."""
    if len(text) <= 1 or measure(text) <= limit:
        return [text]
    middle = len(text) // 2
    return _halve(text[:middle], limit, measure) + _halve(text[middle:], limit, measure)
