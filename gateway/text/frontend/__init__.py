"""The text front-end: a committed segment of the client's text to the text
an engine reads, with an exact span map back (issue 21; ``docs/text.md``).

Markdown and emoji are stripped, numbers, dates, units and the like are
written out in words for the voice's language, a lexicon of pronunciations
is applied, and an SSML subset is read.  One :class:`FrontEnd` per utterance
carries state across segments (open emphasis, code fence, table, SSML tag
stack).  Pure: no I/O, no asyncio, no clock.
"""

from __future__ import annotations

from gateway.text.frontend.core import FrontEnd, hold_back, warm_up
from gateway.text.frontend.types import (
    INPUT_FORMATS,
    FrontEndError,
    FrontEndOptions,
    InputFormat,
    Span,
    SpokenSegment,
)

__all__ = [
    "INPUT_FORMATS",
    "FrontEnd",
    "FrontEndError",
    "FrontEndOptions",
    "InputFormat",
    "Span",
    "SpokenSegment",
    "hold_back",
    "warm_up",
]
