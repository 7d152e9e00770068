"""Invisible format characters, seen through by the normalizers.

A zero-width space or joiner, a word joiner, a soft hyphen, a byte order
mark or a bidirectional mark inside a number (``1\u200d000``, pasted from a
web page or an LLM's output) is not heard, and must not split what is
heard: the normalizers read the text without them, and each edit is mapped
back onto the text with them (an edit that spans one swallows it).  Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Final

from gateway.text.frontend.pieces import Edit

__all__ = ["INVISIBLE", "seeing_through_invisibles"]

#: The format characters (Unicode category Cf) that are seen through.
INVISIBLE: Final = re.compile(
    "[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]"
)


def seeing_through_invisibles(
    normalize: Callable[[str], Iterable[Edit]],
) -> Callable[[str], Iterator[Edit]]:
    """``normalize`` run on the text without its invisible characters, its
    edits mapped back onto the text as given."""

    def run(text: str) -> Iterator[Edit]:
        if INVISIBLE.search(text) is None:
            yield from normalize(text)
            return
        kept = [i for i, ch in enumerate(text) if INVISIBLE.match(ch) is None]
        visible = "".join(text[i] for i in kept)
        for start, end, spoken in normalize(visible):
            lo = kept[start] if start < len(kept) else len(text)
            hi = kept[end - 1] + 1 if end > start else lo
            yield lo, hi, spoken

    return run
