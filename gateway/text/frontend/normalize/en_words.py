"""English number words: cardinals, ordinals, years, digit strings.

Written out here rather than called from ``num2words`` on the hot path:
``num2words`` takes 40 us for ``5`` and 460 us for ``1234567`` on the
development machine (measured in ``docs/text.md``), this takes a few
microseconds.  Tests check it against ``num2words`` (without its commas,
hyphens and British "and").
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = ["MONTHS", "cardinal", "digits", "ordinal", "year"]

#: English month names, January first (dates in normalization and SSML ``say-as``)
MONTHS: Final = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]

_ONES: Final = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS: Final = [
    "_",
    "_",
    "twenty",
    "thirty",
    "forty",
    "fifty",
    "sixty",
    "seventy",
    "eighty",
    "ninety",
]
_SCALES: Final = (
    (10**18, "quintillion"),
    (10**15, "quadrillion"),
    (10**12, "trillion"),
    (10**9, "billion"),
    (10**6, "million"),
    (1000, "thousand"),
)
_ORD_IRREGULAR: Final = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
#: Above this, numbers are read digit by digit.
MAX_CARDINAL: Final = 10**21 - 1


def _below_thousand(n: int) -> str:
    words: list[str] = []
    if n >= 100:
        words += [_ONES[n // 100], "hundred"]
        n %= 100
        if n == 0:
            return " ".join(words)
    if n < 20:
        words.append(_ONES[n])
    else:
        words.append(_TENS[n // 10])
        if n % 10:
            words.append(_ONES[n % 10])
    return " ".join(words)


def cardinal(n: int) -> str:
    """``1234`` -> ``one thousand two hundred thirty four``."""
    if n < 0:
        return "minus " + cardinal(-n)
    if n > MAX_CARDINAL:
        return digits(str(n))
    if n < 1000:
        return _below_thousand(n)
    words: list[str] = []
    for scale, name in _SCALES:
        if n >= scale:
            words += [
                _below_thousand(n // scale) if n // scale < 1000 else cardinal(n // scale),
                name,
            ]
            n %= scale
    if n:
        words.append(_below_thousand(n))
    return " ".join(words)


def ordinal(n: int) -> str:
    """``21`` -> ``twenty first``."""
    words = cardinal(n).split(" ")
    last = words[-1]
    if last in _ORD_IRREGULAR:
        words[-1] = _ORD_IRREGULAR[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def year(n: int) -> str:
    """``2026`` -> ``twenty twenty six``; ``1905`` -> ``nineteen oh five``;
    ``2000`` -> ``two thousand``; ``2009`` -> ``two thousand nine``."""
    if not 1000 <= n <= 9999:
        return cardinal(n)
    hi, lo = divmod(n, 100)
    if lo == 0:
        return cardinal(n) if hi % 10 == 0 else _below_thousand(hi) + " hundred"
    if 2000 <= n <= 2009:
        return cardinal(n)
    if lo < 10:
        return _below_thousand(hi) + " oh " + _ONES[lo]
    return _below_thousand(hi) + " " + _below_thousand(lo)


def digits(text: str) -> str:
    """Each digit as a word: ``"007"`` -> ``zero zero seven``.

    Any character with a digit value counts, in any script and form: ``٣``
    and ``３`` are three, a superscript ``²`` and a circled ``①`` are two and
    one (``str.isdigit`` is true for them, ``int`` refuses them); other
    characters are skipped."""
    words: list[str] = []
    for ch in text:
        value = unicodedata.digit(ch, None)
        if value is not None:
            words.append(_ONES[value])
    return " ".join(words)
