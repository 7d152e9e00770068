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

from gateway.text.frontend.inline import pair_emphasis, scan_inline
from gateway.text.frontend.pieces import Piece

__all__ = ["MAX_HEADER_CHARS", "MAX_NAMED_ROWS", "REF_DEF_START", "MarkdownReader"]

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
# ``[label]: destination "optional title"`` and nothing else on the line
# (``[Note]: read this first.`` is a sentence, and read)
_REF_DEF: Final = re.compile(
    r" {0,3}\[[^\]]{1,200}\]:[ \t]{0,40}(?:<[^<>\n]{0,500}>|\S{1,500})"
    r"(?:[ \t]{1,40}(?:\"[^\"\n]{0,300}\"|'[^'\n]{0,300}'|\([^()\n]{0,300}\)))?[ \t]{0,40}"
)
#: The start of a link reference definition line: the segmenter keeps the
#: line whole (never a cut inside it), as the reader reads it whole.
REF_DEF_START: Final = re.compile(r" {0,3}\[[^\]\n]{1,200}\]:")
_PUNCT_END: Final = ".!?:;,…。！？"
_MAX_EMPHASIS: Final = 8  # carried open emphasis markers, at most


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
        if _RULE.match(line) or _REF_DEF.fullmatch(line):
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

    # --- inline (the shared scanner, gateway.text.frontend.inline) ---------------

    def _inline(self, text: str, start: int, end: int, out: list[Piece]) -> None:
        scan = scan_inline(text, start, end, self.keep_tags)
        items = scan.items
        silent, still_open = pair_emphasis(scan.delims, self.open_emphasis, text)
        for d in silent:
            items[d.index] = Piece("", d.start, d.end)
        for d in still_open:
            # Unclosed: an opener before a word is emphasis that closes later
            # (silent; carried for a later closer, at most _MAX_EMPHASIS).
            if d.end < end and text[d.end].isalnum():
                items[d.index] = Piece("", d.start, d.end)
                if len(self.open_emphasis) < _MAX_EMPHASIS:
                    self.open_emphasis.append(text[d.start : d.end])
        out.extend(items)


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
