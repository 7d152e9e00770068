"""Pronunciations: words and phrases spoken as other text (aliases).

Matching is whole-word (not inside a longer word) and longest-first (``New
York City`` before ``New York``).  Case: a key written all in lower case
matches any case (``nginx`` matches ``Nginx`` and ``NGINX``); a key with a
capital letter matches exactly (``US`` the country, not ``us``).  When the
same key appears twice, the later entry wins (session and request aliases
after the server's file).

The lexicon file (the ``text.lexicon`` setting) is UTF-8 text, one entry a
line: the written form, a TAB, the spoken form.  Blank lines and lines
starting with ``#`` are ignored.  :func:`parse_lexicon` is pure; a bad line
raises :class:`LexiconError` with its line number.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from gateway.text.frontend.pieces import Edit

__all__ = ["MAX_ENTRIES", "Lexicon", "LexiconError", "load_lexicon", "parse_lexicon"]

MAX_ENTRIES: Final = 10_000
MAX_KEY_CHARS: Final = 100
MAX_SPOKEN_CHARS: Final = 300


class LexiconError(ValueError):
    """A lexicon entry or file that cannot be used."""


class Lexicon:
    """A compiled set of pronunciations."""

    def __init__(self, entries: tuple[tuple[str, str], ...]) -> None:
        exact: dict[str, str] = {}
        folded: dict[str, str] = {}
        for key, spoken in entries:
            key = " ".join(key.split())
            if not key:
                continue
            if key.lower() == key:
                folded[key] = spoken
                exact.pop(key, None)
            else:
                exact[key] = spoken
        self._exact = exact
        self._folded = folded
        keys = sorted({*exact, *folded}, key=len, reverse=True)
        if not keys:
            self._pattern: re.Pattern[str] | None = None
            return
        alternation = "|".join(r"\s{1,10}".join(map(re.escape, k.split(" "))) for k in keys)
        self._pattern = re.compile(rf"(?<!\w)(?:{alternation})(?!\w)", re.IGNORECASE)

    def __bool__(self) -> bool:
        return self._pattern is not None

    def edits(self, text: str) -> Iterator[Edit]:
        if self._pattern is None:
            return
        pos = 0
        while True:
            m = self._pattern.search(text, pos)
            if m is None:
                return
            written = " ".join(m.group().split())
            spoken = self._exact.get(written)
            if spoken is None:
                spoken = self._folded.get(written.lower())
            if spoken is None:
                # matched case-insensitively a key that must match exactly:
                # try again one character on (a shorter key may fit)
                pos = m.start() + 1
                continue
            yield m.start(), m.end(), spoken
            pos = m.end()


def parse_lexicon(text: str) -> tuple[tuple[str, str], ...]:
    """The entries of a lexicon file's text."""
    entries: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        written, tab, spoken = line.partition("\t")
        written, spoken = written.strip(), spoken.strip()
        if not tab or not written or not spoken:
            raise LexiconError(f"lexicon line {number}: expected 'written<TAB>spoken'")
        if len(written) > MAX_KEY_CHARS or len(spoken) > MAX_SPOKEN_CHARS:
            raise LexiconError(
                f"lexicon line {number}: longer than {MAX_KEY_CHARS} (written)"
                f" or {MAX_SPOKEN_CHARS} (spoken) characters"
            )
        entries.append((written, spoken))
        if len(entries) > MAX_ENTRIES:
            raise LexiconError(f"lexicon: more than {MAX_ENTRIES} entries")
    return tuple(entries)


def load_lexicon(path: str | Path) -> tuple[tuple[str, str], ...]:
    """Read and parse a lexicon file (at start, never on the event loop's hot path)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LexiconError(f"lexicon {path}: cannot read it ({exc.__class__.__name__})") from exc
    return parse_lexicon(text)
