"""The one Markdown inline scanner: a line's inline constructs, for the reader
and for the segmenter's hold-back alike.

:func:`scan_inline` walks ``text[start:end]`` once and gives

* ``items``: the spoken pieces (markup silent, code and escapes frozen,
  engine tags verbatim, link URLs silent) with each emphasis run still as
  text, and ``delims``, the emphasis runs with their CommonMark flanking;
* ``open_at``: where a construct that the text's end leaves unfinished
  begins (an inline code span without its closing run, a ``[`` or ``![``
  whose ``](...)`` has not closed, a ``<`` that may become a tag, a trailing
  backslash, an emphasis run touching the end that may still grow), or
  ``end`` when none is.

:func:`pair_emphasis` pairs the runs (the same rules for both users).
:class:`~gateway.text.frontend.markdown.MarkdownReader` silences paired runs
and carries open ones across segments; :func:`~gateway.text.frontend.holdback.hold_back`
holds the buffer from the first opener not yet closed.  One scanner, so the
two can never disagree on what is a construct.  Every search is bounded
(``_MAX_LINK``, the tag patterns); pure, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from gateway.text.frontend.pieces import Piece

__all__ = ["Delim", "InlineScan", "flanking", "pair_emphasis", "scan_inline"]

TAG: Final = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]{0,30})(?:\s[^<>]{0,300})?/?>")
COMMENT: Final = re.compile(r"<!--.{0,2000}?-->", re.DOTALL)
AUTOLINK: Final = re.compile(r"<((?:https?|ftp)://[^\s<>]{1,500}|[\w.+-]{1,64}@[\w.-]{1,255})>")
ESCAPABLE: Final = frozenset("\\`*_{}[]()#+-.!|<>~\"'")
_MAX_LINK: Final = 300  # a link's text or URL longer than this is not a link
#: The characters where a construct may begin (``]`` ends a link's text).
_SPECIAL: Final = re.compile(r"[\\`<\[!*_~\]]")
_INCOMPLETE: Final = (-1, -1)  # a link tail the text ended before deciding


@dataclass(slots=True)
class Delim:
    """An emphasis run: ``*``, ``**``, ``_``, ``~~``, ..."""

    char: str
    start: int
    end: int
    can_open: bool
    can_close: bool
    index: int  # its piece in ``InlineScan.items``


@dataclass(slots=True)
class InlineScan:
    items: list[Piece] = field(default_factory=list)
    delims: list[Delim] = field(default_factory=list)
    open_at: int = 0


def scan_inline(
    text: str,
    start: int,
    end: int,
    keep_tags: frozenset[str] = frozenset(),
    *,
    find_open: bool = False,
) -> InlineScan:
    """Scan ``text[start:end]``.  ``find_open``: work out ``open_at`` (the
    hold-back asks; the reader, which reads committed text, does not)."""
    scan = InlineScan(open_at=end)
    items = scan.items
    build = not find_open  # the hold-back needs no pieces
    silent_at: dict[int, int] = {}  # start -> end of link tails ``](url)``
    links = find_open or text.find("](", start, end) >= 0 or text.find("][", start, end) >= 0
    last_gt = text.rfind(">", start, end)  # every tag, comment, autolink ends with one
    i = start
    lit = start  # start of the pending literal text
    while i < end:
        if i not in silent_at:
            m = _SPECIAL.search(text, i, end)
            if m is None:
                break
            i = m.start()
        if i in silent_at:
            j = silent_at.pop(i)
            if build:
                _flush(items, text, lit, i)
                items.append(Piece("", i, j))
            i = lit = j
            continue
        ch = text[i]
        if ch == "\\":
            if i + 1 < end and text[i + 1] in ESCAPABLE:
                if build:
                    _flush(items, text, lit, i)
                    items.append(Piece("", i, i + 1))
                    items.append(Piece(text[i + 1], i + 1, i + 2, frozen=True))
                i = lit = i + 2
                continue
            if i + 1 == end:
                scan.open_at = min(scan.open_at, i)  # it escapes what comes next
        elif ch == "`":
            j = i
            while j < end and text[j] == "`":
                j += 1
            close = _find_run(text, "`", j - i, j, end)
            if close < 0:  # a stray run: silent
                if find_open:
                    scan.open_at = min(scan.open_at, i)
                if build:
                    _flush(items, text, lit, i)
                    items.append(Piece("", i, j))
                i = lit = j
                continue
            cs, ce = j, close
            if ce - cs >= 2 and text[cs] == " " and text[ce - 1] == " ":
                cs, ce = cs + 1, ce - 1
            if build:
                _flush(items, text, lit, i)
                items.append(Piece("", i, cs))
                if ce > cs:
                    items.append(Piece(text[cs:ce], cs, ce, frozen=True))
                items.append(Piece("", ce, close + (j - i)))
            i = lit = close + (j - i)
            continue
        elif ch == "<" and i > last_gt:
            # no ``>`` after it: no tag, comment or autolink, maybe one on its way
            if find_open and (i + 1 == end or text[i + 1] in "/!" or text[i + 1].isalpha()):
                scan.open_at = min(scan.open_at, i)
        elif ch == "<":
            m = COMMENT.match(text, i, end) or TAG.match(text, i, end)
            if m is not None:
                if build:
                    _flush(items, text, lit, i)
                    name = m.group(2).lower() if m.re is TAG else ""
                    kept = name and name in keep_tags and not m.group(1)
                    items.append(
                        Piece(m.group(), i, m.end(), frozen=True) if kept else Piece("", i, m.end())
                    )
                i = lit = m.end()
                continue
            m = AUTOLINK.match(text, i, end)
            if m is not None:
                if build:
                    _flush(items, text, lit, i)
                    items.append(Piece("", i, i + 1))
                    items.append(Piece(m.group(1), i + 1, m.end() - 1))
                    items.append(Piece("", m.end() - 1, m.end()))
                i = lit = m.end()
                continue
        elif (ch == "[" or (ch == "!" and i + 1 < end and text[i + 1] == "[")) and links:
            opener = 2 if ch == "!" else 1
            # once something is open, later brackets cannot hold the text any earlier
            look = not find_open or i < scan.open_at
            tail = _link_tail(text, i + opener, end) if look else None
            if tail == _INCOMPLETE:
                if find_open:
                    scan.open_at = i
            elif tail is not None:
                if build:
                    _flush(items, text, lit, i)
                    items.append(Piece("", i, i + opener))
                silent_at[tail[0]] = tail[1]
                i = lit = i + opener
                continue
        elif ch in "*_~":
            j = i
            while j < end and text[j] == ch and j - i < 3:
                j += 1
            if find_open and j == end:
                scan.open_at = min(scan.open_at, i)  # may grow (``*`` -> ``**``) or open
            if ch == "~" and j - i != 2:
                i = j
                continue
            prev = text[i - 1] if i > start else " "
            nxt = text[j] if j < end else " "
            can_open, can_close = flanking(ch, prev, nxt)
            if build:
                _flush(items, text, lit, i)
            scan.delims.append(Delim(ch, i, j, can_open, can_close, len(items)))
            if build:
                items.append(Piece(text[i:j], i, j))
            i = lit = j
            continue
        i += 1
    if build:
        _flush(items, text, lit, end)
    return scan


def pair_emphasis(
    delims: list[Delim], carried: list[str], text: str
) -> tuple[list[Delim], list[Delim]]:
    """Pair the runs (a closer with the nearest opener of its character).

    Returns ``(silent, open)``: the runs that are markup (paired, or closing
    a run in ``carried``, the markers opened in earlier segments, which are
    removed from it as they close) and the openers left unclosed, in order."""
    silent: list[Delim] = []
    stack: list[Delim] = []
    for d in delims:
        if d.can_close:
            k = len(stack) - 1
            while k >= 0 and stack[k].char != d.char:
                k -= 1
            if k >= 0:
                silent += (stack[k], d)
                del stack[k:]
                continue
            marker = text[d.start : d.end]
            if marker in carried:
                carried.remove(marker)
                silent.append(d)
                continue
        if d.can_open:
            stack.append(d)
    return silent, stack


def _flush(items: list[Piece], text: str, start: int, end: int) -> None:
    if end > start:
        items.append(Piece(text[start:end], start, end))


def _find_run(text: str, ch: str, length: int, start: int, end: int) -> int:
    """Start of the next run of exactly ``length`` ``ch`` in ``text[start:end]``, or -1."""
    i = text.find(ch * length, start, end)
    while i >= 0:
        j = i + length
        if (j >= end or text[j] != ch) and text[i - 1] != ch:
            return i
        while j < end and text[j] == ch:
            j += 1
        i = text.find(ch * length, j, end)
    return -1


def _link_tail(text: str, start: int, end: int) -> tuple[int, int] | None:
    """For a ``[`` just before ``start``: the range of ``](url)``, ``][ref]``
    or ``][]`` closing it; None when it is no link; ``_INCOMPLETE`` when the
    text ends before that is known."""
    depth = 0
    limit = min(end, start + _MAX_LINK)
    i = start
    while i < limit:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            depth += 1
        elif ch == "]":
            if depth:
                depth -= 1
            else:
                break
        i += 1
    else:
        return _INCOMPLETE if limit == end else None
    close = i
    if close + 1 >= end:
        return _INCOMPLETE
    if text[close + 1] not in "([":
        return None
    opening = text[close + 1]
    closing = ")" if opening == "(" else "]"
    depth = 0
    j = close + 2
    limit = min(end, j + _MAX_LINK)
    while j < limit:
        ch = text[j]
        if ch == opening and opening == "(":
            depth += 1
        elif ch == closing:
            if depth == 0:
                return close, j + 1
            depth -= 1
        j += 1
    return _INCOMPLETE if limit == end else None


def _is_punct(ch: str) -> bool:
    return not ch.isalnum() and not ch.isspace()


def flanking(ch: str, prev: str, nxt: str) -> tuple[bool, bool]:
    """(can open, can close) for a run of ``ch`` between ``prev`` and ``nxt``."""
    left = not nxt.isspace() and (not _is_punct(nxt) or prev.isspace() or _is_punct(prev))
    right = not prev.isspace() and (not _is_punct(prev) or nxt.isspace() or _is_punct(nxt))
    if ch == "_":
        return left and (not right or _is_punct(prev)), right and (not left or _is_punct(nxt))
    if prev.isalnum() and nxt.isalnum():
        return False, False  # x**2, a*b: never emphasis
    return left, right
