"""Normalizers by language: a registry of ``language -> normalize(text) -> edits``.

A normalizer takes a run of spoken text and returns the ``(start, end,
replacement)`` edits that write its numbers, dates, units and symbols as
words (see :mod:`gateway.text.frontend.pieces`).  Languages without one get
Markdown and emoji handling only; ``generic.py`` covers whole numbers and
percentages for a few languages with ``num2words``.  To add a language, write
``normalize/<code>.py`` with a ``normalize`` function and add it here
(``docs/text.md``, "Adding a language").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from gateway.text.frontend.normalize import en, generic
from gateway.text.frontend.normalize.invisible import seeing_through_invisibles
from gateway.text.frontend.pieces import Edit

__all__ = ["NORMALIZERS", "Normalizer", "normalizer_for"]

Normalizer = Callable[[str], Iterable[Edit]]

# Every normalizer reads through invisible format characters
# (``normalize/invisible.py``): ``1\u200d000`` is one thousand.
NORMALIZERS: Final[dict[str, Normalizer]] = {
    "en": seeing_through_invisibles(en.normalize),
    # whole numbers and percentages only, with num2words (normalize/generic.py)
    **{code: seeing_through_invisibles(generic.normalizer(code)) for code in generic.PERCENT_WORDS},
}


def normalizer_for(language: str) -> Normalizer | None:
    """The normalizer for a BCP 47 tag (``en``, ``en-US``, ``en_GB``), or None."""
    base = language.replace("_", "-").split("-", 1)[0].lower()
    return NORMALIZERS.get(base)
