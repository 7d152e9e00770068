"""Where a buffered text may still be inside an unfinished construct.

:func:`hold_back` is called by the segmenter on every push, so it looks at a
bounded trailing window (:data:`WINDOW` characters) and only at constructs
still open at the end of the text: a stray ``*`` or ``my_var`` far back never
holds anything, and a construct open longer than the window is let go (the
front-end then carries it across segments).
"""

from __future__ import annotations

import re
from typing import Final

from gateway.text.frontend.markdown import flanking
from gateway.text.frontend.types import InputFormat

__all__ = ["WINDOW", "hold_back"]

#: Characters of look-back.  A link, inline code span or emphasis longer
#: than this may be cut (the front-end carries emphasis; a cut link or code
#: span loses its markup silently).
WINDOW: Final = 200

_REF_DEF: Final = re.compile(r" {0,3}\[[^\]\n]{1,200}\]:")
_RUN: Final = re.compile(r"\*{1,3}|_{1,3}|~~|`{1,10}")
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
    if (line > 0 or lo == 0) and _REF_DEF.match(text, line, n) is not None:
        return line  # a link reference definition: silent, and one piece
    held = n
    open_code: tuple[int, int] | None = None
    openers: list[tuple[str, int, int]] = []
    for m in _RUN.finditer(text, start, n):
        s, e = m.span()
        run = m.group()
        if run[0] == "`":
            if open_code is None:
                open_code = (s, e - s)
            elif open_code[1] == e - s:
                open_code = None
            continue
        if open_code is not None:
            continue
        if e == n:
            held = min(held, s)  # may grow (``*`` -> ``**``) or open
            continue
        prev = text[s - 1] if s > 0 else " "
        can_open, can_close = flanking(run[0], prev, text[e])
        if can_close:
            k = len(openers) - 1
            while k >= 0 and openers[k][0] != run:
                k -= 1
            if k >= 0:
                del openers[k:]
                continue
        if can_open and text[e].isalnum():
            openers.append((run, s, e))
    if open_code is not None:
        held = min(held, open_code[0])
    if openers:
        held = min(held, openers[0][1])
    # links and images: ``[`` not yet closed by ``](...)``
    i = text.rfind("[", start, n)
    while i >= 0:
        close = text.find("]", i, n)
        begin = i - 1 if i > 0 and text[i - 1] == "!" else i
        if close < 0 or close == n - 1:
            held = min(held, begin)
        elif text[close + 1] in "([":
            end_ch = ")" if text[close + 1] == "(" else "]"
            if text.find(end_ch, close + 2, n) < 0:
                held = min(held, begin)
        i = text.rfind("[", start, i)
    # HTML tags and autolinks: ``<`` without its ``>``
    lt = text.rfind("<", start, n)
    if (
        lt >= 0
        and text.find(">", lt, n) < 0
        and (lt == n - 1 or text[lt + 1] in "/!" or text[lt + 1].isalpha())
    ):
        held = min(held, lt)
    # a backslash at the end escapes what comes next
    if text[n - 1] == "\\":
        held = min(held, n - 1)
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
