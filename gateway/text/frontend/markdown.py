"""Markdown to spoken pieces, one committed segment at a time.

What is read how (``docs/text.md`` has the table and examples):

* headings, list markers (``-``, ``*``, ``+``, ``1.``, ``1)``, task boxes),
  block quote markers: silent; a heading or list item that does not end in
  punctuation gets a ``.`` (a pause);
* emphasis (``*``, ``**``, ``_``, ``__``, ``~~``): markers silent, text
  spoken.  Pairing follows CommonMark's flanking rules, with one deliberate
  difference: a ``*`` run between two letters or digits is never emphasis
  (``x**2``, ``a*b``), as ``_`` is not in ``snake_case``;
* inline code: the code is spoken, the backticks are not (and its text is not
  normalized); stray backticks are silent;
* links: the text is spoken, the URL is not; images: the alt text is spoken,
  nothing when it is empty; autolinks ``<https://...>`` are spoken as URLs;
  reference definitions (``[1]: https://...``) are silent;
* fenced code blocks: silent, fences included (a code block is not read
  aloud);
* tables: the separator row is silent; the header row is silent and each of
  the first :data:`MAX_NAMED_ROWS` body rows is read as ``Header: cell,
  Header: cell.``; later rows are read without the names (``cell, cell.``).
  A header longer than :data:`MAX_HEADER_CHARS` is read once, as a row, and
  no row repeats it: a table's reading is at most ``MAX_NAMED_ROWS *
  MAX_HEADER_CHARS`` characters longer than its text;
* horizontal rules and setext underlines: silent;
* HTML tags and comments: silent, except the engine's own tags
  (``keep_tags``), which pass through verbatim.

State carried from one segment to the next: an open code fence, the header
of an open table, and emphasis opened and not yet closed.  A segment is taken
to start at the beginning of a line (the segmenter cuts at sentence ends and,
for Markdown, at the end of block lines).

``markdown-it-py`` and ``mistune`` are not used on this path: neither gives
offsets inside a line (``Token.map`` is block lines only, mistune's AST has no
positions), and the span map needs them; the benchmark
(``bench/text_frontend.py``) measures both against this reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from gateway.text.frontend.pieces import Piece

__all__ = ["MAX_HEADER_CHARS", "MAX_NAMED_ROWS", "MarkdownReader"]

#: Body rows of a table read with their header names; later rows without.
MAX_NAMED_ROWS: Final = 20
#: A header whose names together are longer than this is read once, not per row.
MAX_HEADER_CHARS: Final = 100

_FENCE: Final = re.compile(r" {0,3}(`{3,}|~{3,})")
_HEADING: Final = re.compile(r"( {0,3}#{1,6})(?:[ \t]{1,40}|$)")
_HEADING_TAIL: Final = re.compile(r"[ \t]{1,40}#{1,40}[ \t]{0,40}$")
_QUOTE: Final = re.compile(r" {0,3}>[ \t]?")
_LIST: Final = re.compile(r"[ \t]{0,12}(?:[-*+]|\d{1,9}[.)])[ \t]{1,40}(?:\[[ xX]\][ \t]{1,40})?")
_RULE: Final = re.compile(
    r" {0,3}(?:(?:-[ \t]{0,8}){3,200}|(?:\*[ \t]{0,8}){3,200}"
    r"|(?:_[ \t]{0,8}){3,200}|(?:=[ \t]{0,8}){3,200})$"
)
_TABLE_SEP: Final = re.compile(
    r" {0,3}\|?(?:[ \t]{0,40}:?-{1,200}:?[ \t]{0,40}\|){1,50}"
    r"(?:[ \t]{0,40}:?-{1,200}:?[ \t]{0,40})?$"
)
_REF_DEF: Final = re.compile(r" {0,3}\[[^\]]{1,200}\]:[ \t]{0,40}\S{1,500}")
_TAG: Final = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]{0,30})(?:\s[^<>]{0,300})?/?>")
_COMMENT: Final = re.compile(r"<!--.{0,2000}?-->", re.DOTALL)
_AUTOLINK: Final = re.compile(r"<((?:https?|ftp)://[^\s<>]{1,500}|[\w.+-]{1,64}@[\w.-]{1,255})>")
_PUNCT_END: Final = ".!?:;,…。！？"
_ESCAPABLE: Final = frozenset("\\`*_{}[]()#+-.!|<>~\"'")
_MAX_LINK: Final = 300  # a link's text or URL longer than this is not a link
_MAX_EMPHASIS: Final = 8  # carried open emphasis markers, at most


@dataclass
class _Delim:
    char: str
    start: int
    end: int
    can_open: bool
    can_close: bool
    index: int  # position in the item list


@dataclass
class MarkdownReader:
    """Reads Markdown segments of one utterance, carrying block and emphasis state."""

    keep_tags: frozenset[str] = frozenset()
    fence: str | None = None
    table_header: list[str] | None = None
    table_rows: int = 0  # body rows of the open table read so far
    open_emphasis: list[str] = field(default_factory=list)

    def read(self, segment: str) -> list[Piece]:
        """The pieces of one segment, line by line (the line breaks copied)."""
        pieces: list[Piece] = []
        if not segment:
            return pieces
        pos = 0
        while True:
            nl = segment.find("\n", pos)
            self._line(segment, pos, len(segment) if nl < 0 else nl, pieces)
            if nl < 0:
                return pieces
            pieces.append(Piece("\n", nl, nl + 1))
            pos = nl + 1

    def finish(self) -> None:
        self.fence = None
        self.table_header = None
        self.open_emphasis.clear()

    # --- block level ----------------------------------------------------------

    def _line(self, text: str, start: int, end: int, out: list[Piece]) -> None:
        line = text[start:end]
        fence = _FENCE.match(line)
        if self.fence is not None:
            if (
                fence
                and fence.group(1)[0] == self.fence[0]
                and len(fence.group(1)) >= len(self.fence)
                and not line[fence.end() :].strip()
            ):
                self.fence = None
            out.append(Piece("", start, end))
            return
        if fence and not (fence.group(1)[0] == "`" and "`" in line[fence.end() :]):
            self.fence = fence.group(1)
            out.append(Piece("", start, end))
            return
        if not line.strip():
            self.table_header = None
            self.open_emphasis.clear()
            if line:
                out.append(Piece(line, start, end))
            return
        if line.lstrip().startswith("|"):
            self._table_row(text, start, end, out)
            return
        self.table_header = None
        if _RULE.match(line) or _REF_DEF.match(line):
            out.append(Piece("", start, end))
            return
        pos = start
        pause = False
        while True:  # block quote markers, nested
            m = _QUOTE.match(text, pos, end)
            if m is None:
                break
            out.append(Piece("", pos, m.end()))
            pos = m.end()
        m = _HEADING.match(text, pos, end)
        if m is not None:
            out.append(Piece("", pos, m.end()))
            pos = m.end()
            tail = _HEADING_TAIL.search(text, pos, end)
            if tail is not None:
                end_text = tail.start()
                self._inline(text, pos, end_text, out)
                out.append(Piece("", end_text, end))
                self._pause(text, pos, end_text, out)
                return
            self.open_emphasis.clear()
            pause = True
        else:
            m = _LIST.match(text, pos, end)
            if m is not None and not _RULE.match(text, pos, end):
                out.append(Piece("", pos, m.end()))
                pos = m.end()
                pause = True
        self._inline(text, pos, end, out)
        if pause:
            self._pause(text, pos, end, out)

    @staticmethod
    def _pause(text: str, start: int, end: int, out: list[Piece]) -> None:
        body = text[start:end].rstrip().rstrip("*_~`)\"'")
        if body and body[-1] not in _PUNCT_END:
            out.append(Piece(".", end, end, copied=False, frozen=True))

    def _table_row(self, text: str, start: int, end: int, out: list[Piece]) -> None:
        line = text[start:end]
        if _TABLE_SEP.match(line):
            out.append(Piece("", start, end))
            return
        cells = _cells(text, start, end)
        names: list[str] = []
        if self.table_header is None:
            header = [_plain(text[s:e]) for s, e in cells]
            self.table_rows = 0
            if sum(map(len, header)) <= MAX_HEADER_CHARS:
                self.table_header = header
                out.append(Piece("", start, end))
                return
            self.table_header = []  # too long to repeat: read once, as a row
        elif self.table_rows < MAX_NAMED_ROWS:
            names = self.table_header
        if self.table_header:
            self.table_rows += 1
        cursor = start
        spoken_any = False
        for i, (s, e) in enumerate(cells):
            if not text[s:e].strip():
                continue
            out.append(Piece("", cursor, s))
            name = names[i] if i < len(names) else ""
            prefix = (", " if spoken_any else "") + (f"{name}: " if name else "")
            if prefix:
                out.append(Piece(prefix, s, s, copied=False, frozen=True))
            self._inline(text, s, e, out)
            spoken_any = True
            cursor = e
        out.append(Piece("", cursor, end))
        if spoken_any:
            out.append(Piece(".", end, end, copied=False, frozen=True))

    # --- inline ---------------------------------------------------------------

    def _inline(self, text: str, start: int, end: int, out: list[Piece]) -> None:
        items: list[Piece] = []
        delims: list[_Delim] = []
        silent_at: dict[int, int] = {}  # start -> end of link tails ``](url)``
        links = text.find("](", start, end) >= 0 or text.find("][", start, end) >= 0
        i = start
        lit = start  # start of the pending literal text
        while i < end:
            if i in silent_at:
                _flush(items, text, lit, i)
                j = silent_at.pop(i)
                items.append(Piece("", i, j))
                i = lit = j
                continue
            ch = text[i]
            if ch == "\\" and i + 1 < end and text[i + 1] in _ESCAPABLE:
                _flush(items, text, lit, i)
                items.append(Piece("", i, i + 1))
                items.append(Piece(text[i + 1], i + 1, i + 2, frozen=True))
                i = lit = i + 2
                continue
            if ch == "`":
                j = i
                while j < end and text[j] == "`":
                    j += 1
                close = _find_run(text, "`", j - i, j, end)
                _flush(items, text, lit, i)
                if close < 0:
                    items.append(Piece("", i, j))
                    i = lit = j
                    continue
                cs, ce = j, close
                if ce - cs >= 2 and text[cs] == " " and text[ce - 1] == " ":
                    cs, ce = cs + 1, ce - 1
                items.append(Piece("", i, cs))
                if ce > cs:
                    items.append(Piece(text[cs:ce], cs, ce, frozen=True))
                items.append(Piece("", ce, close + (j - i)))
                i = lit = close + (j - i)
                continue
            if ch == "<":
                m = _COMMENT.match(text, i, end) or _TAG.match(text, i, end)
                if m is not None:
                    _flush(items, text, lit, i)
                    name = m.group(2).lower() if m.re is _TAG else ""
                    if name and name in self.keep_tags and not m.group(1):
                        items.append(Piece(m.group(), i, m.end(), frozen=True))
                    else:
                        items.append(Piece("", i, m.end()))
                    i = lit = m.end()
                    continue
                m = _AUTOLINK.match(text, i, end)
                if m is not None:
                    _flush(items, text, lit, i)
                    items.append(Piece("", i, i + 1))
                    items.append(Piece(m.group(1), i + 1, m.end() - 1))
                    items.append(Piece("", m.end() - 1, m.end()))
                    i = lit = m.end()
                    continue
            if (ch == "[" or (ch == "!" and i + 1 < end and text[i + 1] == "[")) and links:
                opener = 2 if ch == "!" else 1
                tail = _link_tail(text, i + opener, end)
                if tail is not None:
                    _flush(items, text, lit, i)
                    items.append(Piece("", i, i + opener))
                    silent_at[tail[0]] = tail[1]
                    i = lit = i + opener
                    continue
            if ch in "*_~":
                j = i
                while j < end and text[j] == ch and j - i < 3:
                    j += 1
                if ch == "~" and j - i != 2:
                    i = j
                    continue
                _flush(items, text, lit, i)
                prev = text[i - 1] if i > start else " "
                nxt = text[j] if j < end else " "
                can_open, can_close = flanking(ch, prev, nxt)
                delims.append(_Delim(ch, i, j, can_open, can_close, len(items)))
                items.append(Piece(text[i:j], i, j))
                i = lit = j
                continue
            i += 1
        _flush(items, text, lit, end)
        self._pair(delims, items, text, end)
        out.extend(items)

    def _pair(self, delims: list[_Delim], items: list[Piece], text: str, end: int) -> None:
        """Silence paired emphasis markers; carry the open ones."""
        stack: list[_Delim] = []
        for d in delims:
            if d.can_close:
                k = len(stack) - 1
                while k >= 0 and stack[k].char != d.char:
                    k -= 1
                if k >= 0:
                    items[stack[k].index] = Piece("", stack[k].start, stack[k].end)
                    items[d.index] = Piece("", d.start, d.end)
                    del stack[k:]
                    continue
                marker = text[d.start : d.end]
                if marker in self.open_emphasis:
                    self.open_emphasis.remove(marker)
                    items[d.index] = Piece("", d.start, d.end)
                    continue
            if d.can_open:
                stack.append(d)
        for d in stack:
            # Unclosed: an opener before a word is emphasis that closes later.
            if d.end < end and text[d.end].isalnum() and len(self.open_emphasis) < _MAX_EMPHASIS:
                items[d.index] = Piece("", d.start, d.end)
                self.open_emphasis.append(text[d.start : d.end])


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
    or ``][]`` closing it, or None when it is no link."""
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
        return None
    close = i
    if close + 1 >= end or text[close + 1] not in "([":
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
    return None


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


def _cells(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The cell ranges of a table row (escaped pipes stay in their cell)."""
    cells: list[tuple[int, int]] = []
    i = text.find("|", start, end) + 1
    cell = i
    while i < end:
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "|":
            cells.append(_trim(text, cell, i))
            cell = i + 1
        i += 1
    if text[cell:end].strip():
        cells.append(_trim(text, cell, end))
    return cells


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


_MARKUP: Final = re.compile(r"[*_`~]|\[([^\]]{0,200})\]\([^)]{0,500}\)")


def _plain(cell: str) -> str:
    """A header cell's words, its markup removed."""
    return _MARKUP.sub(lambda m: m.group(1) or "", cell).strip()
