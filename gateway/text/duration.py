"""How long a text will take to speak, before the engine knows: one estimate.

The session core (how much committed audio lies ahead of the listener), the
audio stream (the engine deadline of a prefetched segment) and the
segmentation policy (when the listener runs dry) all plan with audio that
has not been synthesized yet.  They use this one function, so that the
three agree.  Pure: no I/O, no clock.

It counts the characters that will be *spoken*, not the characters sent
(issue 21): the policy plans with the client's text, before the front-end
(``gateway.text.frontend``) has read it, so Markdown markers, a fenced code
block (skipped, ``docs/text.md``), a link's URL or reference definition,
a bare URL's scheme and path punctuation, and emoji count nothing, and a
digit counts as the few letters its words take.  The core and the stream
pass the front-end's output (words already), which this leaves as it is.
It is an estimate, not a second reading: the front-end alone decides what is
spoken (a table test in ``tests/text/test_duration.py`` holds the two close).
"""

from __future__ import annotations

import functools
import re
from typing import Final

#: seconds of speech per spoken character: English at speed 1 is about 0.06 s
SECONDS_PER_CHAR: Final = 0.06
#: spoken characters per digit ("1,234.56": "one thousand two hundred thirty
#: four point five six", 51 letters for 6 digits; "2026": 17 for 4)
CHARS_PER_DIGIT: Final = 5

#: text that is never spoken as written: a code block, a link's target or
#: reference, a list item's marker, a URL's scheme, Markdown's markers,
#: runs of rule or table characters, and emoji
_SILENT = re.compile(
    r"```.*?(?:```|\Z)"  # a fenced code block (the front-end skips it)
    r"|^\s*\[[^\]\n]+\]:\s*\S+"  # a link reference definition
    r"|^[ \t]*(?:[-*+]|\d+[.)])[ \t]+(?:\[[ xX]\][ \t]*)?"  # a list item's marker
    r"|\]\([^)\s]*\)"  # [text](target): the target
    r"|[a-z][a-z0-9+.-]*://"  # a scheme
    r"|[*_#`>|~]+"  # emphasis, headings, code, quotes, tables, strike
    r"|[-=]{3,}"  # rules, table separators
    r"|[\U0001F000-\U0001FAFF\u2600-\u27BF\uFE0F\u200D]+",  # emoji and joiners
    re.IGNORECASE | re.DOTALL | re.MULTILINE,
)
_DIGIT = re.compile(r"\d")
_SPACES = re.compile(r"\s{2,}")


#: texts up to this long are remembered (``spoken_chars``)
_REMEMBERED_CHARS: Final = 2048


def spoken_chars(text: str) -> int:
    """About how many characters ``text`` has once spoken (a run of
    whitespace is one pause).

    The last 1,024 texts of at most 2,048 characters are remembered: the
    session asks on every text increment about every segment committed and
    not yet sent, and a session waiting at the door keeps all of its
    segments unsent.  A longer text (a segment whose spoken form a lexicon
    alias or a run of numbers made long) is counted each time and never
    kept, so the memory stays within a few megabytes whatever clients
    send."""
    if len(text) > _REMEMBERED_CHARS:
        return _count(text)
    return _remembered(text)


def _count(text: str) -> int:
    kept = _SPACES.sub(" ", _SILENT.sub("", text)).strip()
    digits = len(_DIGIT.findall(kept))
    return len(kept) + digits * (CHARS_PER_DIGIT - 1)


_remembered = functools.lru_cache(maxsize=1024)(_count)


def estimate_seconds(text: str, speed: float = 1.0) -> float:
    """Estimated seconds of audio ``text`` makes at ``speed`` (1 = normal)."""
    return spoken_chars(text) * SECONDS_PER_CHAR / speed
