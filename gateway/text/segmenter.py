"""Incremental text segmentation for streaming speech.

Text arrives in small increments (LLM tokens, STT output); the segmenter
decides where one speakable *segment* (a sentence, or a clause for the first
segment of an utterance) ends, so synthesis can start before the text is
complete.  The rules are specified in ``docs/segmentation.md``.

This module is pure: no I/O, no asyncio, no clock.  It knows where the text
*may* be cut; when an earlier cut below sentence level is worth its prosody
cost is decided by ``gateway.text.policy`` from the listener's buffer,
through :meth:`Segmenter.candidates` and :meth:`Segmenter.cut_at`.

Design: chunking invariance
---------------------------
For any chunking of the same text, ``push`` of every chunk followed by
``flush`` yields the same segments.  This holds by construction:

* every decision about a candidate boundary is a function of the text up to a
  bounded look-ahead, and is taken only once that look-ahead has arrived
  (otherwise the candidate is *undecided* and the scan stops there, waiting
  for more text), so a decision taken on a prefix is the decision the whole
  text would give;
* after each cut the scan starts again on the remainder with the same rules,
  so the sequence of cuts is the same whatever the arrival pattern;
* the buffer always holds the concatenation of everything pushed and not
  emitted (surrogate halves are joined on arrival), and decisions skip over
  leading whitespace, so the state after a push does not depend on how the
  text was split.

:meth:`Segmenter.cut_at` is the one deliberate exception: the policy calls it
when the listener's buffer runs low, so it depends on timing by definition
(the policy keeps its own, timed, invariance; see ``segment_policy``).

Input formats
-------------
With ``input_format="markdown"`` or ``"ssml"`` a cut is never committed
inside a construct still open at the end of the buffer (emphasis, inline
code, a link or image, an SSML tag or ``<say-as>``/``<sub>`` element; see
``gateway.text.frontend.hold_back``, which looks back a bounded window): the
cut waits until the construct is closed or has grown past the window, then is
the cut the whole text would give, so chunking invariance holds.  Markdown
adds line rules: a line break after a block line (heading, list item, block
quote, table row, fence, rule), before one, or before a blank line is a
sentence boundary; punctuation inside a table row is not (a row is one
segment).  In SSML, punctuation inside a tag (an attribute) is no boundary.
A code block or table longer than ``max_chars`` is cut by the cap like any
text (the front-end carries the fence and the table header).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Final, Literal, get_args

from gateway.text.frontend import InputFormat, hold_back
from gateway.text.frontend.markdown import REF_DEF_START
from gateway.text.frontend.ssml import MAX_TAG

__all__ = [
    "DEFAULT_MAX_CHARS",
    "GRANULARITIES",
    "Candidate",
    "CandidateKind",
    "Granularity",
    "Segmenter",
    "end_kind",
    "is_speakable",
]

Granularity = Literal["auto", "sentence", "clause", "none"]
GRANULARITIES: Final[tuple[str, ...]] = get_args(Granularity)

#: Default length cap of one segment, in code points.
DEFAULT_MAX_CHARS: Final = 300

# --- character classes -------------------------------------------------------

_CJK_TERM: Final = "\u3002\uff01\uff1f\uff61"  # 。！？｡
_CJK_CLAUSE: Final = "\uff0c\uff1b\uff1a"  # ，；：
_STRONG: Final = "!?" + _CJK_TERM
_CLAUSE: Final = ",;:\u2014\u2013" + _CJK_CLAUSE  # , ; : — – ， ； ：
_PUNCT: Final = ".\u2026" + _STRONG + _CLAUSE
# Closing quotes and brackets (and Markdown emphasis) after the punctuation
# belong to the segment.
_CLOSERS: Final = (
    "\"')]}\u201d\u2019\u00bb\u203a\u300d\u300f\uff09\u300b\u3009\u3011\u3015\u3017\u3019\u301b*_`"
)
# Skipped when looking at the first visible character of the next sentence.
_OPENERS: Final = (
    "\"'([{\u201c\u2018\u00ab\u2039"
    "\u300c\u300e\uff08\u300a\u3008\u3010\u3014\u3016\u3018\u301a\u00bf\u00a1*_`"
)
# Spaces that forbid a line break: never a boundary, never a cut point.
_NO_BREAK_SPACES: Final = "\u00a0\u2007\u202f"
_ZWJ: Final = "\u200d"

_CLUSTER: Final = re.compile("[" + re.escape(_PUNCT) + "][" + re.escape(_PUNCT + _CLOSERS) + "]*")
# Markdown: line breaks are boundary candidates too.
_CLUSTER_MD: Final = re.compile(_CLUSTER.pattern + "|\n")
# SSML: a <break> tag is a sentence boundary after it, so its pause falls at a
# segment's end (where the gateway makes the silence), never inside one.
_CLUSTER_SSML: Final = re.compile(r"<break\b[^<>]*>|" + _CLUSTER.pattern, re.IGNORECASE)
_CLUSTERS: Final = {"markdown": _CLUSTER_MD, "ssml": _CLUSTER_SSML}
# A Markdown line that is a block of its own, and the start of one.
_BLOCK_LINE: Final = re.compile(
    r" {0,3}(?:#{1,6}(?:\s|$)|[-*+]\s|\d{1,9}[.)]\s|>|\||```|~~~|[-*_=]{3,}\s*$"
    r"|\[[^\]\n]{1,200}\]:)"
)
_BLOCK_LOOKAHEAD: Final = 12
_SPEAKABLE: Final = re.compile(r"[^\W_]")  # a letter or a digit, any script
_SURROGATE: Final = re.compile("[\ud800-\udfff]")

# Words (lower case, without the final dot) whose period never ends a
# sentence.  Multi-letter dotted initialisms (U.S.A., J.R.R.) are caught by
# _INITIALISM; single initials ("J.") by the single-capital rule.
_NEVER_BREAK: Final = frozenset(
    {"dr", "mr", "mrs", "ms", "st", "vs", "prof", "cf", "e.g", "i.e", "u.s", "u.k", "ph.d"}
)
_INITIALISM: Final = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")
# Dotted words that behave like an ordinary word at a period: a boundary
# unless the next word starts in lower case.
_WEAK_DOTTED: Final = frozenset({"a.m", "p.m"})


# Words after which a cut below clause level is never made (it would leave an
# article, preposition or conjunction hanging at the end of a segment), and
# words a cut may come right before (the start of a phrase).  English only;
# in other languages every word boundary is a plain ``word`` candidate.
def _word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_NO_CUT_AFTER: Final = _word_set(
    "a an the of to in on at for with by from into onto upon about as and or nor but"
    " so if than that this these those my your his her its our their is are was were"
    " be been am not no very just more most less such"
)
_PHRASE_STARTERS: Final = _word_set(
    "and but or so because which who whom whose where when while although though"
    " since until unless whereas if then that before after"
)


class _MarkupTags:
    """The engine's own inline tags (``Capabilities.markup_tags``: Orpheus'
    ``<laugh>``, ...): kept whole, never cut from the words before them, not
    counted as words.  Text to every other engine."""

    def __init__(self, tags: tuple[str, ...]) -> None:
        self.tags = tags
        self.pattern = re.compile("|".join(re.escape(tag) for tag in tags) or r"(?!)")
        self.longest = max(map(len, tags), default=0)

    def may_begin(self, word: str) -> bool:
        """``word`` starts with a tag, or with the beginning of one."""
        return any(tag.startswith(word[: len(tag)]) for tag in self.tags)


_CUT: Final = 0
_NO: Final = 1
_WAIT: Final = 2


CandidateKind = Literal["clause", "phrase", "word"]


@dataclass(frozen=True)
class Candidate:
    """A decided place where the buffered text may be cut below sentence level."""

    end: int  #: offset in the buffered text, after its leading whitespace
    kind: CandidateKind  #: ``phrase``: the next word starts a phrase (``and``, ``which``)
    words: int  #: speakable words before the cut


def end_kind(segment: str) -> Literal["sentence", "clause"] | None:
    """How ``segment`` ends: at sentence or clause punctuation, or neither
    (a cut below clause level, a cap cut or the end of the input).

    Closing quotes and brackets after the punctuation are skipped."""
    body = segment.rstrip().rstrip(_CLOSERS)
    if not body:
        return None
    last = body[-1]
    if last in _CLAUSE:
        return "clause"
    if last in _PUNCT:
        return "sentence"
    return None


def is_speakable(text: str) -> bool:
    """True when ``text`` holds at least one letter or digit (any script)."""
    return _SPEAKABLE.search(text) is not None


def _has_speakable(text: str, start: int, end: int) -> bool:
    return start < end and _SPEAKABLE.search(text, start, end) is not None


#: SSML: a tag, or one begun at the end of the text (markup, not speech)
_SSML_MARKUP: Final = re.compile(r"<[^<>]*(?:>|$)")


def _is_high(ch: str) -> bool:
    return "\ud800" <= ch <= "\udbff"


def _is_low(ch: str) -> bool:
    return "\udc00" <= ch <= "\udfff"


def _join_surrogates(text: str) -> str:
    """Replace valid surrogate pairs by the code point they encode."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _is_break_space(ch: str) -> bool:
    return ch.isspace() and ch not in _NO_BREAK_SPACES


def _is_extender(ch: str) -> bool:
    """A character that belongs to the grapheme before it."""
    o = ord(ch)
    if 0xDC00 <= o <= 0xDFFF:  # low surrogate: second half of a pair
        return True
    if ch in "\u200c\u200d" or 0xFE00 <= o <= 0xFE0F or 0xE0100 <= o <= 0xE01EF:
        return True  # joiners, variation selectors
    if 0x1F3FB <= o <= 0x1F3FF or 0xE0020 <= o <= 0xE007F:
        return True  # emoji skin tones, tag characters
    return unicodedata.category(ch) in ("Mn", "Mc", "Me")


def _can_cut_at(text: str, i: int) -> bool:
    """Whether ``text[:i] | text[i:]`` keeps every grapheme whole."""
    return not _is_extender(text[i]) and text[i - 1] != _ZWJ


def _unless_held(cut: int, hold: int) -> int | None:
    """``cut``, or None (wait) while it would split a construct still open."""
    return cut if cut <= hold else None


def _in_one_piece_line(text: str, i: int) -> bool:
    """Whether ``text[i]`` is on a Markdown table row (a line starting ``|``)
    or a link reference definition: lines read as one piece."""
    line = text.rfind("\n", 0, i) + 1
    return (
        text[line : line + 4].lstrip(" ")[:1] == "|" or REF_DEF_START.match(text, line) is not None
    )


_ENTITY_MAX: Final = 10  # ``&#x10FFFF;``


def _ssml_open_at(body: str, cap: int) -> int | None:
    """SSML: where the tag or character reference that a cut at ``cap`` would
    split begins, or None when a cut there splits neither."""
    start: int | None = None
    lt = body.rfind("<", 0, cap)
    if lt >= 0 and body.find(">", lt, cap) < 0:
        start = lt
    amp = body.rfind("&", max(0, cap - _ENTITY_MAX), cap)
    if amp >= 0 and body.find(";", amp, cap) < 0 and not body[amp + 1 : amp + 2].isspace():
        start = amp if start is None else min(start, amp)
    return start


def _ssml_markup_end(body: str) -> int | None:
    """SSML: the end of the tag or reference that starts ``body``, or None
    while it has not ended (within :data:`MAX_TAG` characters)."""
    end = body.find(">" if body[0] == "<" else ";", 0, MAX_TAG if body[0] == "<" else _ENTITY_MAX)
    return None if end < 0 else end + 1


def _token_before(text: str, s: int) -> str:
    """The word that ends at ``s``, without leading quotes or brackets."""
    j = s
    while j > 0 and not text[j - 1].isspace():
        j -= 1
    return text[j:s].lstrip(_OPENERS)


class Segmenter:
    """Cuts a stream of text increments into speakable segments.

    One instance serves one context: a sequence of utterances, each ended by
    :meth:`end_utterance`.
    """

    def __init__(
        self,
        granularity: Granularity = "auto",
        *,
        max_chars: int = DEFAULT_MAX_CHARS,
        input_format: InputFormat | None = None,
        markup_tags: tuple[str, ...] = (),
    ) -> None:
        """``input_format`` (``markdown``, ``ssml``, ``plain``): cuts keep
        that format's constructs whole; None (the default) is ``plain``.
        ``markup_tags``: the engine's own inline tags (its capabilities'
        ``markup_tags``), each kept whole with the words before it."""
        if granularity not in GRANULARITIES:
            raise ValueError(
                f"granularity must be one of {', '.join(GRANULARITIES)}, got {granularity!r}"
            )
        if max_chars < 1:
            raise ValueError(f"max_chars must be at least 1, got {max_chars}")
        self._mode: Granularity = granularity
        self._max = max_chars
        self._format: InputFormat = input_format or "plain"
        self._cluster = _CLUSTERS.get(self._format, _CLUSTER)
        self._tags = _MarkupTags(tuple(markup_tags))
        self._buf = ""
        self._emitted = False  # a segment of the current utterance has left
        self._cap_memo: tuple[str, int] | None = None  # (text up to the cap, its cut)

    # --- public API -------------------------------------------------------------

    @property
    def granularity(self) -> Granularity:
        return self._mode

    @property
    def input_format(self) -> InputFormat:
        return self._format

    @property
    def markup_tags(self) -> tuple[str, ...]:
        return self._tags.tags

    @property
    def buffered(self) -> str:
        """Text accepted and not yet emitted (may start with whitespace)."""
        return self._buf

    @property
    def awaiting_first_segment(self) -> bool:
        """True in ``auto`` mode while no segment of this utterance has left."""
        return self._mode == "auto" and not self._emitted

    def push(self, text: str) -> list[str]:
        """Accept a text increment; return the segments that are ready now."""
        if not text:
            return []
        self._append(text)
        if self._mode == "none":
            return []
        return [p.strip() for p in self._drain(final=False)]

    def candidates(self) -> list[Candidate]:
        """The decided places where the buffered text may be cut early.

        Only in ``auto`` mode; only in the text after the last segment, which
        (after :meth:`push`) holds no decided sentence boundary.  Each place is
        decided on confirmed text, as every boundary is: a clause mark once the
        character after it is known, a word boundary once the next word has
        begun.  Never inside a number, URL, e-mail address or other token
        without whitespace, never right after an abbreviation, an initial or a
        word that leaves the segment hanging (``the``, ``of``, ``and``), never
        between two numbers.  None at all while the buffer ends in sentence
        punctuation whose meaning is undecided: the sentence may be complete.
        ``phrase`` is a word boundary before a word that starts a phrase; it
        needs that word complete (followed by whitespace).
        """
        if self._mode != "auto":
            return []
        body = self._buf.lstrip()
        n = min(len(body), hold_back(body, self._format) + 1)
        out: list[Candidate] = []
        clause_ends: set[int] = set()
        for m in self._cluster.finditer(body, 0, n):
            s, e = m.span()
            if m.group() == "\n" or m.group()[0] == "<":
                continue  # a line or a <break>: a sentence boundary, cut at push
            decision = self._decide(body, m.group(), s, e, final=False, clause_ok=True)
            sig = [ch for ch in m.group() if ch in _PUNCT]
            if decision == _WAIT:
                if sig[-1] not in _CLAUSE:
                    # the sentence may be complete (text sent whole, then
                    # flushed): never cut it early
                    return []
                n = s  # nothing after an undecided boundary is decided
                break
            if decision == _CUT and sig[-1] in _CLAUSE and _has_speakable(body, 0, s):
                clause_ends.add(e)
        for i in range(1, n):
            if i in clause_ends:
                out.append(Candidate(i, "clause", self._words(body, i)))
                continue
            if not (_is_break_space(body[i]) and not body[i - 1].isspace()):
                continue
            if end_kind(body[:i]) is not None:
                continue  # punctuation that is no boundary here (``Dr.``, ``e.g.,``)
            if self._cut_ok(body, i, final=False) != _CUT:
                continue
            if self._format == "markdown" and _in_one_piece_line(body, i):
                continue
            kind = self._word_kind(body, i)
            if kind is not None:
                out.append(Candidate(i, kind, self._words(body, i)))
        return out

    def cut_at(self, end: int) -> str:
        """Emit the buffered text up to ``end`` (a :meth:`candidates` offset)
        as a segment, stripped."""
        buf = self._buf
        body = buf.lstrip()
        if not 0 < end <= len(body):
            raise ValueError(f"cut offset {end} outside the buffered text")
        lead = len(buf) - len(body)
        self._buf = buf[lead + end :]
        self._emitted = True
        return body[:end].strip()

    def flush(self) -> list[str]:
        """Emit everything buffered, cut at sentence boundaries (and the cap).

        The buffer is empty afterwards, except for a trailing lone high
        surrogate, which waits for its other half.
        """
        hold = ""
        if self._buf and _is_high(self._buf[-1]):
            hold = self._buf[-1]
            self._buf = self._buf[:-1]
        pieces = self._cap_pieces() if self._mode == "none" else self._drain(final=True)
        if self._buf.strip():
            pieces.append(self._buf)
        self._buf = hold
        self._cap_memo = None  # decided at the end of the text: not for a later one
        segments = self._merge_unspeakable(pieces)
        if segments:
            self._emitted = True
        return segments

    def end_utterance(self) -> None:
        """Start a new utterance: the first-segment rule applies again.

        Buffered text is kept (call :meth:`flush` first, or :meth:`discard`).
        """
        self._emitted = False

    def discard(self) -> str:
        """Drop the buffered text (cancel) and start a new utterance.

        Returns what was dropped.
        """
        dropped, self._buf = self._buf, ""
        self._emitted = False
        return dropped

    # --- internals --------------------------------------------------------------

    def _append(self, text: str) -> None:
        text = _join_surrogates(text)
        buf = self._buf
        if buf and text and _is_high(buf[-1]) and _is_low(text[0]):
            pair = buf[-1] + text[0]
            buf = buf[:-1] + _join_surrogates(pair)
            text = text[1:]
        self._buf = buf + text

    def _drain(self, *, final: bool) -> list[str]:
        """Cut segments off the buffer while the rules allow.

        Returns raw pieces (each with the whitespace that preceded it).
        """
        pieces: list[str] = []
        while True:
            buf = self._buf
            body = buf.lstrip()
            cut = self._find_cut(body, final=final)
            if cut is None:
                return pieces
            end = len(buf) - len(body) + cut
            pieces.append(buf[:end])
            self._buf = buf[end:]
            self._emitted = True

    def _words(self, body: str, end: int) -> int:
        """Spoken words before ``end`` (an engine tag is not one)."""
        tag = self._tags.pattern
        return sum(
            1 for word in body[:end].split() if is_speakable(word) and not tag.fullmatch(word)
        )

    def _word_kind(self, body: str, i: int) -> CandidateKind | None:
        """``phrase`` or ``word`` for a cut at the whitespace ``body[i]``, or
        None where a cut is not allowed."""
        before = _token_before(body, i)
        low = before.lower().rstrip(_CLOSERS)
        if not is_speakable(before) or low.rstrip(".") in _NO_CUT_AFTER:
            return None
        if before.endswith(".") and self._period_never_breaks(body, i - 1):
            return None
        j = i
        while j < len(body) and body[j].isspace():
            j += 1
        k = j
        while k < len(body) and not body[k].isspace():
            k += 1
        after = body[j:k]
        if before[-1:].isdigit() and after[:1].isdigit():
            return None  # 3 000, 12 34: possibly one number
        complete = k < len(body)
        tags = self._tags
        if (
            after[:1] == "<"
            and tags.tags
            and (tags.pattern.match(after) or (not complete and tags.may_begin(after)))
        ):
            return None  # an engine tag (or what may become one) stays with its words
        if complete and after.lower().lstrip(_OPENERS) in _PHRASE_STARTERS:
            return "phrase"
        return "word"

    def _cap_pieces(self) -> list[str]:
        """``none`` mode at flush: cut by the length cap only."""
        pieces: list[str] = []
        while True:
            buf = self._buf
            body = buf.lstrip()
            if len(body) <= self._max:
                return pieces
            cut = self._cap_cut(body, final=True)
            assert cut is not None  # final cuts always decide
            end = len(buf) - len(body) + cut
            pieces.append(buf[:end])
            self._buf = buf[end:]

    def _find_cut(self, body: str, *, final: bool) -> int | None:
        """The end of the next segment in ``body`` (no leading space), or None.

        None means: wait for more text (or, when ``final``, the rest of the
        buffer is the last segment).
        """
        clause_ok = not final and (
            self._mode == "clause" or (self._mode == "auto" and not self._emitted)
        )
        n = len(body)
        cap = self._max
        hold = n if final else hold_back(body, self._format)
        # A confirmed boundary whose following segment is not yet known to be
        # speakable: if nothing speakable follows before the next boundary,
        # that text merges into this segment.
        pending: int | None = None
        over_cap = False
        for m in self._cluster.finditer(body):
            s, e = m.span()
            if pending is not None and self._speakable(body, pending, s):
                return _unless_held(pending, hold)
            if e > cap:
                over_cap = True
                break
            if m.group() == "\n":
                decision = self._newline(body, s, final=final)
            elif m.group()[0] == "<":
                decision = self._cut_ok(body, e, final=final)  # after a <break>
            else:
                decision = self._decide(body, m.group(), s, e, final=final, clause_ok=clause_ok)
            if decision == _WAIT:
                return None
            if decision == _CUT and (pending is not None or self._speakable(body, 0, s)):
                pending = e
        if pending is not None:
            if over_cap or n > cap or self._speakable(body, pending, n):
                return _unless_held(pending, hold)
            return None
        if n > cap:
            cut = self._cached_cap_cut(body, final=final)
            return None if cut is None else _unless_held(cut, hold)
        return None

    def _cached_cap_cut(self, body: str, *, final: bool) -> int | None:
        """:meth:`_cap_cut`, decided once: a decided cut depends only on the
        text before it and a bounded look-ahead, which later text does not
        change, so while it waits for a construct to close (``hold``) each
        push does not search again."""
        key = body[: self._max + 1]
        if self._cap_memo is not None and self._cap_memo[0] == key:
            return self._cap_memo[1]
        cut = self._cap_cut(body, final=final)
        self._cap_memo = None if cut is None else (key, cut)
        return cut

    def _newline(self, body: str, s: int, *, final: bool) -> int:
        """Markdown: whether the line break ``body[s]`` ends a segment."""
        line = body.rfind("\n", 0, s) + 1
        if _BLOCK_LINE.match(body, line, s) or body[line:s].strip() == "":
            return self._cut_ok(body, s + 1, final=final)
        ahead = body[s + 1 : s + 1 + _BLOCK_LOOKAHEAD]
        if not final and len(ahead) < _BLOCK_LOOKAHEAD and "\n" not in ahead:
            return _WAIT
        if ahead[:1] == "\n" or _BLOCK_LINE.match(ahead):
            return self._cut_ok(body, s + 1, final=final)
        return _NO

    def _decide(
        self, body: str, cluster: str, s: int, e: int, *, final: bool, clause_ok: bool
    ) -> int:
        """Whether the punctuation cluster ``body[s:e]`` ends a segment."""
        sig = [ch for ch in cluster if ch in _PUNCT]
        last = sig[-1]
        is_clause = last in _CLAUSE
        if is_clause and not clause_ok:
            return _NO
        if self._format == "markdown" and _in_one_piece_line(body, s):
            return _NO  # a table row or a reference definition is read as one piece
        if self._format == "ssml" and body.rfind("<", 0, s) > body.rfind(">", 0, s):
            return _NO  # inside a tag (an attribute value)
        nxt = self._peek(body, e, final=final)
        if nxt is None:
            return _NO if final else _WAIT
        if last in _CJK_TERM or last in _CJK_CLAUSE:
            return self._cut_ok(body, e, final=final)
        if not _is_break_space(nxt):
            # word—word: an em dash between letters is a clause boundary.
            if last == "\u2014" and nxt.isalpha() and s > 0 and body[s - 1].isalpha():
                return self._cut_ok(body, e, final=final)
            return _NO  # 3.14, 1,000, 10:30, x.com/a?b, a@b.com, ...
        if is_clause:
            if _token_before(body, s).lower() in _NEVER_BREAK:
                return _NO
            if last == "," and s > 0 and body[s - 1].isdigit():
                visible = self._next_visible(body, e, final=final)
                if visible is None:
                    return _NO if final else _WAIT
                if visible.isdigit():
                    return _NO  # "Dec 1, 2026", "3, 4, 5": one run of numbers
            return self._cut_ok(body, e, final=final)
        if any(ch in _STRONG for ch in sig):
            return self._cut_ok(body, e, final=final)
        ellipsis = len(sig) > 1 or "\u2026" in sig
        if not ellipsis and self._period_never_breaks(body, s):
            return _NO
        visible = self._next_visible(body, e, final=final)
        if visible is None:
            return _NO if final else _WAIT
        if visible.islower() or (ellipsis and not visible.isupper()):
            return _NO
        return self._cut_ok(body, e, final=final)

    def _speakable(self, text: str, start: int = 0, end: int | None = None) -> bool:
        """Whether ``text[start:end]`` has a letter or digit to speak; in SSML
        a tag's name and attributes are markup (``<speak><break/>`` is not
        speech, so no segment ends after it alone)."""
        end = len(text) if end is None else end
        if self._format != "ssml" or "<" not in text[start:end]:
            return _has_speakable(text, start, end)
        return is_speakable(_SSML_MARKUP.sub(" ", text[start:end]))

    def _cut_ok(self, body: str, i: int, *, final: bool) -> int:
        """A cut at ``i`` is allowed unless the next visible character is a
        mark that belongs to the whitespace before it (never starts a
        segment with a combining mark)."""
        n = len(body)
        while i < n and body[i].isspace():
            i += 1
        ch = self._peek(body, i, final=final)
        if ch is None:
            return _CUT if final else _WAIT
        return _NO if _is_extender(ch) else _CUT

    @staticmethod
    def _period_never_breaks(body: str, s: int) -> bool:
        token = _token_before(body, s)
        low = token.lower()
        if low in _NEVER_BREAK:
            return True
        if len(token) == 1 and token.isupper() and token != "I":
            return True  # an initial: J. R. R. Tolkien
        if _INITIALISM.fullmatch(token) and low not in _WEAK_DOTTED:
            return True  # U.S.A., J.R.R.
        # A list marker ("1. Preheat the oven.") at the start of a segment.
        return token.isdigit() and not _has_speakable(body, 0, s - len(token))

    @staticmethod
    def _peek(body: str, i: int, *, final: bool) -> str | None:
        """``body[i]``, or None while it is unknown."""
        if i >= len(body):
            return None
        ch = body[i]
        if not final and i == len(body) - 1 and _is_high(ch):
            return None  # its low half may still come
        return ch

    def _next_visible(self, body: str, i: int, *, final: bool) -> str | None:
        """The first character after spaces and opening quotes, from ``i``."""
        n = len(body)
        while i < n and (body[i].isspace() or body[i] in _OPENERS):
            i += 1
        return self._peek(body, i, final=final)

    def _cap_cut(self, body: str, *, final: bool) -> int | None:
        """A cut at or before the cap, for ``len(body) > max_chars``."""
        cap = self._max
        if self._format == "ssml":
            markup = _ssml_open_at(body, cap)
            if markup == 0:
                # a tag or reference longer than the cap starts the text: the
                # cut is right after it, once it has ended (a tag that does not
                # end within MAX_TAG characters is cut by the cap, and refused)
                end = _ssml_markup_end(body)
                if end is not None:
                    return end
                if not final and len(body) <= MAX_TAG:
                    return None
            elif markup is not None:
                cap = markup  # never inside a tag or a character reference
        i = cap
        while i > 0:
            if _is_break_space(body[i]):
                held = hold_back(body[:i], self._format) if self._format != "plain" else i
                if held < i:
                    # inside a link, code span, emphasis or tag that begins at
                    # ``held``: so is every place after it, go before it (one
                    # scan per open construct, not per space)
                    i = held
                    continue
                ok = self._cut_ok(body, i, final=final)
                if ok == _WAIT:
                    return None
                if ok == _CUT:
                    return i
            i -= 1
        if cap < self._max:
            return cap  # no whitespace before the tag or reference: before it
        # No whitespace: cut at the cap, keeping graphemes whole.
        if self._peek(body, cap, final=final) is None:
            return None
        i = cap
        while i > 0 and (body[i].isspace() or not _can_cut_at(body, i)):
            i -= 1
        if self._format == "ssml":
            lt = body.rfind("<", 0, i)
            if lt > 0 and lt > body.rfind(">", 0, i):
                return lt  # never inside a tag: before it
        tags = self._tags
        start = body.rfind("<", max(0, i - tags.longest + 1), i) if tags.tags else -1
        if start > 0:  # never inside an engine tag: before it
            tag = tags.pattern.match(body, start)
            if tag is None and not final and any(t.startswith(body[start:]) for t in tags.tags):
                return None  # it may still become one
            if tag is not None and tag.end() > i:
                i = start
        if i > 0:
            return i
        # One base character followed by more than ``cap`` marks: cut after.
        i = cap + 1
        while i < len(body):
            if self._peek(body, i, final=final) is None:
                return None
            if not body[i].isspace() and _can_cut_at(body, i):
                return i
            i += 1
        return len(body) if final else None

    def _merge_unspeakable(self, pieces: list[str]) -> list[str]:
        """Merge pieces without a letter or digit into a neighbour.

        Into the previous piece of this batch, else into the next; never
        beyond the length cap.
        """
        out: list[str] = []
        for piece in pieces:
            if (
                out
                and not (self._speakable(piece) and self._speakable(out[-1]))
                and len((out[-1] + piece).strip()) <= self._max
            ):
                out[-1] += piece
            else:
                out.append(piece)
        return [p for p in (piece.strip() for piece in out) if p]
