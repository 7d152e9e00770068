"""An SSML subset, read as it streams, segment by segment.

Read: ``<speak>``, ``<p>``, ``<s>`` (structure), ``<break time="500ms">`` or
``strength`` (a pause made by the gateway, ``SpokenSegment.pauses``),
``<sub alias="...">`` (the alias is spoken, the content is not),
``<say-as interpret-as="characters|spell-out|digits|cardinal|ordinal|telephone|date">``
(``format`` ``mdy`` (default), ``dmy`` or ``ymd`` for dates).  Any other tag is
ignored and its text kept.  The five XML entities and numeric character
references are decoded.

Refused, as :class:`FrontEndError` naming the position: a DTD, entity
declaration or CDATA section (``<!``), a tag that does not parse, an end tag
that does not close the open element, nesting deeper than :data:`MAX_DEPTH`,
an unknown entity, and (at :meth:`SsmlReader.finish`) elements left open.
The pieces read before the error are returned with it.

State carried across segments: the element stack, an open ``<sub>`` or
``<say-as>``, and a tag cut in two by a segment boundary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from gateway.text.frontend.normalize.en_words import MONTHS, cardinal, digits, ordinal, year
from gateway.text.frontend.pieces import Piece

__all__ = ["MAX_BREAK_MS", "MAX_DEPTH", "MAX_TAG", "SsmlError", "SsmlReader"]

MAX_DEPTH: Final = 32
MAX_BREAK_MS: Final = 10_000
#: The longest tag read (a longer one is refused).
MAX_TAG: Final = 1000

_START: Final = re.compile(
    r"<([A-Za-z][\w:.-]{0,40})((?:\s{1,40}[\w:.-]{1,40}\s{0,40}=\s{0,40}(?:\"[^\"<]{0,500}\"|'[^'<]{0,500}')){0,20})\s{0,40}(/?)>"
)
_END: Final = re.compile(r"</([A-Za-z][\w:.-]{0,40})\s{0,40}>")
_PI: Final = re.compile(r"<\?[^<>]{0,500}\?>")
_COMMENT: Final = re.compile(r"<!--.{0,2000}?-->", re.DOTALL)
_ATTR: Final = re.compile(
    r"([\w:.-]{1,40})\s{0,40}=\s{0,40}(?:\"([^\"<]{0,500})\"|'([^'<]{0,500})')"
)
_ENTITY: Final = re.compile(r"&(?:(amp|lt|gt|quot|apos)|#(\d{1,7})|#x([0-9A-Fa-f]{1,6}));")
_NAMED: Final = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}
_TIME: Final = re.compile(r"\s{0,10}(\d{1,6}(?:\.\d{1,3})?)\s{0,10}(ms|s)\s{0,10}")
_STRENGTH: Final = {
    "none": 0,
    "x-weak": 100,
    "weak": 200,
    "medium": 400,
    "strong": 700,
    "x-strong": 1000,
}


class SsmlError(ValueError):
    def __init__(self, message: str, position: int, pieces: list[Piece]) -> None:
        super().__init__(message)
        self.message = message
        self.position = position  # in the segment
        self.pieces = pieces


@dataclass
class _Held:
    """An open ``<sub>`` or ``<say-as>``."""

    name: str
    attrs: dict[str, str]


@dataclass
class SsmlReader:
    keep_tags: frozenset[str] = frozenset()  # the engine's own tags: verbatim, never elements
    stack: list[str] = field(default_factory=list)
    held: _Held | None = None
    partial: str = ""  # a tag begun at the end of the previous segment

    def read(self, segment: str) -> list[Piece]:
        out: list[Piece] = []
        content: list[Piece] = []  # inside <say-as>
        try:
            return self._read(segment, out, content)
        except SsmlError as exc:
            if exc.pieces is content:  # refused inside <say-as>: what came before too
                exc.pieces = out + content
            raise

    def _read(self, segment: str, out: list[Piece], content: list[Piece]) -> list[Piece]:
        text = segment
        i = 0
        n = len(text)
        lead = self.partial
        self.partial = ""
        while i < n:
            lt = text.find("<", i) if not lead else i
            stop = n if lt < 0 else lt
            if stop > i:
                self._text(text, i, stop, content if self._in_say_as() else out)
            if lt < 0:
                break
            close = text.find(">", lt)
            if close < 0:
                if len(lead) + n - lt > MAX_TAG:
                    raise SsmlError("a tag longer than 1000 characters", lt, out)
                self.partial = lead + text[lt:]
                if content:  # <say-as> text before the cut tag, in order
                    out.extend(self._say_as(content, text))
                    content.clear()
                out.append(Piece("", lt, n))
                break
            tag = lead + text[lt : close + 1]
            tag_start = lt
            lead = ""
            if content:  # <say-as> text before a tag: read, in order
                out.extend(self._say_as(content, text))
                content.clear()
            self._tag(tag, tag_start, close + 1, out)
            i = close + 1
        if content:
            out.extend(self._say_as(content, text))
        return out

    def finish(self) -> int | None:
        """At the end of the utterance: the problem left open, or None."""
        if self.partial:
            self.partial = ""
            return 1
        if self.stack or self.held is not None:
            self.stack.clear()
            self.held = None
            return 2
        return None

    def _in_say_as(self) -> bool:
        return self.held is not None and self.held.name == "say-as"

    def _text(self, text: str, start: int, end: int, out: list[Piece]) -> None:
        if self.held is not None and self.held.name == "sub":
            out.append(Piece("", start, end))
            return
        pos = start
        while True:
            amp = text.find("&", pos, end)
            if amp < 0:
                break
            if amp > pos:
                out.append(Piece(text[pos:amp], pos, amp))
            pos = amp
            m = _ENTITY.match(text, amp, end)
            if m is None:
                if amp + 1 == end or text[amp + 1].isspace():
                    continue_at = amp + 1  # a bare ampersand before a space: kept
                    out.append(Piece("&", amp, continue_at))
                    pos = continue_at
                    continue
                raise SsmlError("unknown entity (write &amp; for '&')", amp, out)
            if m.group(1):
                char = _NAMED[m.group(1)]
            else:
                code = int(m.group(2)) if m.group(2) else int(m.group(3), 16)
                if not 0 < code <= 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                    raise SsmlError("character reference out of range", amp, out)
                char = chr(code)
            out.append(Piece(char, amp, m.end(), copied=False))
            pos = m.end()
        if end > pos:
            out.append(Piece(text[pos:end], pos, end))

    def _tag(self, tag: str, start: int, end: int, out: list[Piece]) -> None:
        if tag.startswith("<!--"):
            if _COMMENT.fullmatch(tag) is None:
                raise SsmlError("malformed comment", start, out)
            out.append(Piece("", start, end))
            return
        if tag.startswith("<!"):
            raise SsmlError("DTDs, entity declarations and CDATA are not accepted", start, out)
        if tag.startswith("<?"):
            if _PI.fullmatch(tag) is None:
                raise SsmlError("malformed processing instruction", start, out)
            out.append(Piece("", start, end))
            return
        m = _END.fullmatch(tag)
        if m is not None:
            name = m.group(1).lower()
            if self.held is not None and name == self.held.name:
                self.held = None
            if not self.stack or self.stack[-1] != name:
                expected = f"</{self.stack[-1]}>" if self.stack else "no end tag"
                raise SsmlError(
                    f"</{name}> does not close the open element (expected {expected})", start, out
                )
            self.stack.pop()
            out.append(Piece("", start, end))
            return
        m = _START.fullmatch(tag)
        if m is None:
            raise SsmlError("malformed tag (write &lt; for '<')", start, out)
        name = m.group(1).lower()
        if name in self.keep_tags and not m.group(2).strip():
            out.append(Piece(tag, start, end, frozen=True))
            return
        attrs = {
            a.group(1).lower(): a.group(2) if a.group(2) is not None else a.group(3) or ""
            for a in _ATTR.finditer(m.group(2))
        }
        empty = bool(m.group(3))
        if not empty and len(self.stack) >= MAX_DEPTH:
            raise SsmlError(f"elements nested deeper than {MAX_DEPTH}", start, out)
        if name == "break":
            out.append(Piece("", start, end, copied=False, frozen=True, pause_ms=_break_ms(attrs)))
        elif self.held is None and name == "sub" and not empty:
            alias = attrs.get("alias", "")
            out.append(Piece(alias, start, end, copied=False, frozen=True))
            self.held = _Held(name, attrs)
        elif self.held is None and name == "say-as" and not empty:
            out.append(Piece("", start, end))
            self.held = _Held(name, attrs)
        else:
            out.append(Piece("", start, end))
        if not empty:
            self.stack.append(name)

    def _say_as(self, content: list[Piece], text: str) -> list[Piece]:
        held = self.held
        words = "".join(p.text for p in content)
        lo = min(p.source_start for p in content)
        hi = max(p.source_end for p in content)
        kind = held.attrs.get("interpret-as", "") if held is not None else ""
        fmt = held.attrs.get("format", "mdy") if held is not None else "mdy"
        spoken = interpret(words, kind, fmt)
        if spoken is None:
            return content
        lead = len(words) - len(words.lstrip())
        trail = len(words) - len(words.rstrip())
        spoken = words[:lead] + spoken + (words[len(words) - trail :] if trail else "")
        return [Piece(spoken, lo, hi, copied=False, frozen=True)]


def _break_ms(attrs: dict[str, str]) -> int:
    time = attrs.get("time")
    if time is not None:
        m = _TIME.fullmatch(time)
        if m is None:
            return _STRENGTH["medium"]
        value = float(m.group(1)) * (1 if m.group(2) == "ms" else 1000)
        return min(MAX_BREAK_MS, round(value))
    return _STRENGTH.get(attrs.get("strength", "medium"), _STRENGTH["medium"])


def interpret(words: str, kind: str, fmt: str = "mdy") -> str | None:
    """``<say-as>`` content read as ``kind`` (English words), or None to keep it."""
    body = words.strip()
    if not body:
        return None
    if kind in ("characters", "spell-out"):
        return " ".join(digits(ch) if ch.isdigit() else ch for ch in body if not ch.isspace())
    if kind == "digits":
        return " ".join(digits(ch) if ch.isdigit() else ch for ch in body if not ch.isspace())
    if kind in ("cardinal", "number"):
        value = body.replace(",", "")
        return cardinal(int(value)) if re.fullmatch(r"-?\d{1,15}", value) else None
    if kind == "ordinal":
        value = body.replace(",", "").rstrip("stndrh")
        return ordinal(int(value)) if re.fullmatch(r"\d{1,15}", value) else None
    if kind == "telephone":
        groups = re.findall(r"\+?\d{1,12}", body)
        return ", ".join(("plus " if g.startswith("+") else "") + digits(g) for g in groups) or None
    if kind == "date":
        return _date(body, fmt)
    return None


def _date(body: str, fmt: str) -> str | None:
    parts = re.split(r"[-/.]", body)
    if not all(p.isdecimal() for p in parts) or len(parts) != len(fmt):
        return None
    values = dict(zip(fmt, (int(p) for p in parts), strict=True))
    month, day, yr = values.get("m"), values.get("d"), values.get("y")
    words: list[str] = []
    if month is not None:
        if not 1 <= month <= 12:
            return None
        words.append(MONTHS[month - 1])
    if day is not None:
        if not 1 <= day <= 31:
            return None
        words.append(ordinal(day))
    spoken = " ".join(words)
    if yr is not None:
        spoken = (spoken + ", " if spoken else "") + year(yr)
    return spoken
