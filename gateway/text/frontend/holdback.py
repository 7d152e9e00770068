"""Where a buffered text may still be inside an unfinished construct.

For Markdown it runs the reader's own inline scanner
(:mod:`gateway.text.frontend.inline`), so the two agree on what a construct
is.  :func:`hold_back` is called by the segmenter on every push, so it looks
at a bounded trailing window (:data:`WINDOW` characters) and only at
constructs still open at the end of the text: a stray ``*`` or ``my_var`` far
back never holds anything, and a construct open longer than the window is
let go (the front-end then carries it across segments).
"""

from __future__ import annotations

import re
from typing import Final

from gateway.text.frontend.inline import pair_emphasis, scan_inline
from gateway.text.frontend.markdown import REF_DEF_START
from gateway.text.frontend.types import InputFormat

__all__ = ["WINDOW", "hold_back"]

#: Characters of look-back.  A link, inline code span or emphasis longer
#: than this may be cut (the front-end carries emphasis; a cut link or code
#: span loses its markup silently).
WINDOW: Final = 200

_SSML_HELD: Final = re.compile(r"<(say-as|sub)\b[^<>]{0,300}>", re.IGNORECASE)


def hold_back(text: str, input_format: InputFormat) -> int:
    """The smallest index i such that ``text[i:]`` might be an unfinished
    Markdown construct (emphasis marker, inline code, link or image) or SSML
    tag (or ``<say-as>``/``<sub>`` element, or entity); ``len(text)`` when
    nothing is open.  Looks back over :data:`WINDOW` characters only.  A
    segmenter must not cut inside ``text[i:]`` (a cut at ``i`` is fine)."""
    n = len(text)
    if input_format == "plain" or n == 0:
        return n
    lo = max(0, n - WINDOW)
    if input_format == "ssml":
        return _ssml(text, lo, n)
    return _markdown(text, lo, n)


def _markdown(text: str, lo: int, n: int) -> int:
    line = text.rfind("\n", lo, n) + 1
    start = max(lo, line)
    if (line > 0 or lo == 0) and REF_DEF_START.match(text, line, n) is not None:
        return line  # a link reference definition: silent, and one piece
    # the reader's own scanner: what it would read as a construct, and where
    # one is still open at the end
    scan = scan_inline(text, start, n, find_open=True)
    held = scan.open_at
    _, still_open = pair_emphasis(scan.delims, [], text)
    for d in still_open:
        if d.end < n and text[d.end].isalnum():
            return min(held, d.start)  # emphasis opened and not yet closed
    return held


def _ssml(text: str, lo: int, n: int) -> int:
    held = n
    lt = text.rfind("<", lo, n)
    if lt >= 0 and text.find(">", lt, n) < 0:
        held = lt
    amp = text.rfind("&", max(lo, n - 12), n)
    if amp >= 0 and text.find(";", amp, n) < 0 and not text[amp + 1 : amp + 2].isspace():
        held = min(held, amp)
    for m in _SSML_HELD.finditer(text, lo, n):
        if m.group().endswith("/>"):
            continue
        if text.lower().find(f"</{m.group(1).lower()}", m.end(), n) < 0:
            held = min(held, m.start())
            break
    return held
