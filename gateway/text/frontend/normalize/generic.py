"""Numbers in words for languages without a normalizer of their own, with
``num2words``: whole numbers (no separators: ``1.234`` means different
things in different languages, so it is left to the engine) and
percentages.  A start for a language, not its full normalizer; English has
``en.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import partial
from typing import Final

from num2words import num2words

from gateway.text.frontend.pieces import Edit

__all__ = ["PERCENT_WORDS", "normalize"]

#: The word for "percent", by language (the languages num2words and this
#: registry cover).
PERCENT_WORDS: Final = {
    "de": "Prozent",
    "fr": "pour cent",
    "es": "por ciento",
    "it": "per cento",
    "pt": "por cento",
    "nl": "procent",
}

_NUMBER: Final = re.compile(r"(?<![\w.,:/-])(\d{1,9})(\s?%)?(?![\w]|[.,:/]\d)")


def normalize(text: str, *, language: str) -> Iterator[Edit]:
    """The edits that write ``text``'s whole numbers in ``language``'s words."""
    for m in _NUMBER.finditer(text):
        spoken = str(num2words(int(m.group(1)), lang=language))
        if m.group(2):
            spoken += " " + PERCENT_WORDS[language]
        yield m.start(), m.end(), spoken


def normalizer(language: str) -> partial[Iterator[Edit]]:
    return partial(normalize, language=language)
