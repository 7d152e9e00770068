"""English normalization: digits and symbols written out as words.

One combined, ordered alternation (leftmost match; at one position the first
rule listed wins), so the order is the precedence: e-mail and URLs before
anything with dots, phone numbers and dates before ranges, currency and units
before bare numbers.  Every repeat is bounded (no ReDoS: a match is at most a
few hundred characters whatever the input).  Each match is one rewritten,
atomic piece in the span map.

Forms the rules do not recognise are left for the engine (Piper's phonemizer
reads plain words, ``3:45 PM`` and ``Dr.`` correctly on its own).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Final

from gateway.text.frontend.normalize.en_words import (
    MAX_CARDINAL,
    MONTHS,
    cardinal,
    digits,
    ordinal,
    year,
)
from gateway.text.frontend.pieces import Edit

__all__ = ["normalize"]

_MONTH_ABBR: Final = {m[:3].lower(): i for i, m in enumerate(MONTHS)} | {"sept": 8}

_CURRENCY: Final = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "", ""),
    "₹": ("rupee", "rupees", "paisa", "paise"),
}
_SCALE_WORDS: Final = {
    "k": "thousand",
    "m": "million",
    "mm": "million",
    "b": "billion",
    "bn": "billion",
    "t": "trillion",
}

# unit -> (singular, plural).  Case matters (``MB`` megabytes, ``mb`` not a unit).
_UNITS: Final = {
    "kg": ("kilogram", "kilograms"),
    "mg": ("milligram", "milligrams"),
    "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    "km": ("kilometer", "kilometers"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"),
    "mi": ("mile", "miles"),
    "ft": ("foot", "feet"),
    "mph": ("mile per hour", "miles per hour"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "ms": ("millisecond", "milliseconds"),
    "sec": ("second", "seconds"),
    "min": ("minute", "minutes"),
    "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"),
    "KB": ("kilobyte", "kilobytes"),
    "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"),
    "TB": ("terabyte", "terabytes"),
    "Mbps": ("megabit per second", "megabits per second"),
    "Gbps": ("gigabit per second", "gigabits per second"),
    "kHz": ("kilohertz", "kilohertz"),
    "Hz": ("hertz", "hertz"),
    "MHz": ("megahertz", "megahertz"),
    "GHz": ("gigahertz", "gigahertz"),
    "kW": ("kilowatt", "kilowatts"),
    "kWh": ("kilowatt hour", "kilowatt hours"),
    "mL": ("milliliter", "milliliters"),
    "ml": ("milliliter", "milliliters"),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°C": ("degree Celsius", "degrees Celsius"),
    "°": ("degree", "degrees"),
}
# Ambiguous unit letters: only glued to the number (``5m``, never ``5 m``).
_GLUED_UNITS: Final = {
    "m": ("meter", "meters"),
    "g": ("gram", "grams"),
    "s": ("second", "seconds"),
    "h": ("hour", "hours"),
    "L": ("liter", "liters"),
    "l": ("liter", "liters"),
    "V": ("volt", "volts"),
    "W": ("watt", "watts"),
}

# Abbreviation -> spoken; the final dot is part of the key.
_ABBREVIATIONS: Final = {
    "Mr.": "Mister",
    "Mrs.": "Missus",
    "Ms.": "Miz",
    "Dr.": "Doctor",
    "Prof.": "Professor",
    "Sr.": "Senior",
    "Jr.": "Junior",
    "e.g.": "for example",
    "i.e.": "that is",
    "etc.": "et cetera",
    "vs.": "versus",
    "vs": "versus",
    "approx.": "approximately",
    "Ave.": "Avenue",
    "Rd.": "Road",
    "Blvd.": "Boulevard",
    "Apt.": "Apartment",
    "Dept.": "Department",
}

_NUM: Final = r"\d{1,3}(?:,\d{3}){1,6}|\d{1,15}"  # 1,234,567 or 1234567
_DEC: Final = rf"(?:{_NUM})(?:\.\d{{1,12}})?"
_B: Final = r"(?<![\w.,/:@*^-])"  # a number starts here (not inside a word, URL, version)
_E: Final = r"(?![\w]|[.,]\d)"  # ... and ends here
_DASH: Final = r"(?:--|[–-])"  # a range's dash: ``5-10``, ``5–10``, ``5--10``
_MINUS: Final = r"(?:-|−)"

_UNIT_ALT: Final = "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
_GLUED_ALT: Final = "|".join(re.escape(u) for u in _GLUED_UNITS)
_ABBR_ALT: Final = "|".join(re.escape(a) for a in sorted(_ABBREVIATIONS, key=len, reverse=True))
_MONTH_ALT: Final = "|".join(MONTHS) + "|" + "|".join(m[:3] for m in MONTHS) + "|Sept"

_RULES: Final[tuple[tuple[str, str], ...]] = (
    (
        "email",
        r"(?<![\w.+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){1,6}",
    ),
    ("url", r"\b(?:https?://|www\.)[^\s<>()\[\]\"']{1,300}"),
    (
        "domain",
        r"(?<![\w@.])[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){0,3}"
        r"\.(?:com|org|net|io|dev|ai|edu|gov|app|co|uk|de|fr)(?:/[\w./-]{0,200})?(?![\w@])",
    ),
    (
        "phone",
        r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{3}\)\s?|\d{3}[ .-])\d{3}[ .-]\d{4}(?!\w|-\d)",
    ),
    ("iso_date", r"(?<![\w-])(\d{4})-(\d{2})-(\d{2})(?![\w]|-\d)"),
    ("slash_date", r"(?<![\w/])(\d{1,2})/(\d{1,2})/(\d{4})(?![\w/])"),
    (
        "month_date",
        rf"\b({_MONTH_ALT})\.? (\d{{1,2}})(?:st|nd|rd|th)?\b(?:,? (\d{{4}})\b)?",
    ),
    ("time", r"(?<![\w:])(\d{1,2}):(\d{2})(?::(\d{2}))?(?:\s?([AaPp])\.?[Mm]\b\.?)?(?![\w:])"),
    ("time_ampm", r"(?<![\w:.])(\d{1,2})\s?([AaPp])\.?[Mm]\b\.?"),
    (
        "money",
        rf"(?<![\w])({_MINUS})?([$€£¥₹])({_MINUS})?\s?({_DEC})(?!,\d)"
        r"(?:\s?(bn|[KkMmBbTt])\b|\s(thousand|million|billion|trillion)\b)?",
    ),
    ("cents", rf"{_B}(\d{{1,3}})¢"),
    (
        "version",
        r"(?<![\w.])(?:[vV](\d{1,4}(?:\.\d{1,4}){1,3})|(\d{1,4}(?:\.\d{1,4}){2,3}))(?![\w]|\.\d)",
    ),
    ("percent_range", rf"{_B}({_DEC})\s?{_DASH}\s?({_DEC})\s?%"),
    ("percent", rf"{_B}(-|−)?({_DEC})\s?%"),
    ("unit_range", rf"{_B}({_DEC})\s?{_DASH}\s?({_DEC})\s?({_UNIT_ALT})(?![\w])"),
    ("unit", rf"{_B}(-|−)?({_DEC})\s?({_UNIT_ALT})(?![\w])"),
    ("decade", r"(?<![\w])(1[0-9]|20)([0-9]0)s\b"),
    ("glued_unit", rf"{_B}({_DEC})({_GLUED_ALT})(?![\w])"),
    ("scaled", rf"{_B}({_DEC})(K|M|B|bn)(?![\w])"),
    ("ordinal", rf"{_B}(\d{{1,9}})(st|nd|rd|th)\b"),
    ("mixed_fraction", rf"{_B}(\d{{1,6}}) (\d{{1,3}})/(\d{{1,3}}){_E}"),
    ("fraction", rf"{_B}(\d{{1,6}})/(\d{{1,3}}){_E}"),
    # after a word character only when it is a fraction too (``½½``)
    ("vulgar", r"(?:(?<!\w)|(?<=[½⅓⅔¼¾⅛]))(\d{1,6})?\s?([½⅓⅔¼¾⅛])"),
    ("range", rf"{_B}({_DEC})\s?{_DASH}\s?({_DEC}){_E}"),
    (
        "year_after",
        r"\b(in|In|since|Since|by|By|until|from|From|of|year|around|before|after)"
        r" (1[1-9]\d\d|20\d\d)(?:\s?(?:--|[–-])\s?(1[1-9]\d\d|20\d\d|\d\d))?(?![\w]|[.,/-]\d)",
    ),
    # a sign only where it cannot be a hyphen or a dash (``COVID-19``, ``5--10``)
    ("number", rf"(?<![\w.,/:@*^])(?:(?<![\w-])({_MINUS}))?({_DEC}){_E}"),
    ("abbreviation", rf"(?<![\w.])({_ABBR_ALT})(?![\w])"),
    ("street", r"(?<=[A-Za-z] )St\.?(?=\s|$|,)|(?<![\w.])St\.(?= [A-Z])"),
    ("number_sign", r"(?<![\w&])#(\d{1,6})\b"),
    ("amp", r"(?<= )&(?= )"),
    ("times", r"(?<=\d) ?× ?(?=\d)"),
)
_PATTERN: Final = re.compile("|".join(f"(?P<{name}>{rx})" for name, rx in _RULES))


# Every rule needs one of these somewhere in the text: a cheap test first
# (most segments of prose have none, and skip the big alternation).
_TRIGGER: Final = re.compile(
    r"[\d@&#×½⅓⅔¼¾⅛$€£¥₹]|://|www\.|\.(?:com|org|net|io|dev|ai|edu|gov|app|co|uk|de|fr)\b"
    rf"|(?<![\w.])(?:{_ABBR_ALT}|St\b)"
)


def normalize(text: str) -> Iterator[Edit]:
    """The edits that write ``text``'s numbers, dates, units ... in words."""
    if _TRIGGER.search(text) is None:
        return
    for m in _PATTERN.finditer(text):
        kind = m.lastgroup
        assert kind is not None
        spoken = _HANDLERS[kind](m, text)
        if spoken is not None and spoken != m.group():
            yield m.start(), m.end(), spoken


# --- readers ------------------------------------------------------------------


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def number(s: str) -> str:
    """A written number (``1,234``, ``3.14``, ``007``) in words."""
    whole, _, frac = s.partition(".")
    if len(whole) > 1 and whole.startswith("0") and "," not in whole:
        words = digits(whole)
    else:
        value = _int(whole)
        words = cardinal(value) if value <= MAX_CARDINAL else digits(whole)
    if frac:
        words += " point " + digits(frac)
    return words


def _is_one(s: str) -> bool:
    return s.replace(",", "") in ("1", "1.0", "1.00")


def _sub(m: re.Match[str], i: int) -> str:
    """The ``i``-th capture group inside the matched rule (1-based)."""
    base = m.re.groupindex[m.lastgroup or ""]
    return m.group(base + i) or ""


def _spell_word(part: str) -> str:
    """A URL or e-mail part: digits one by one, words as they are."""
    out: list[str] = []
    for tok in re.findall(r"[A-Za-z]{1,64}|\d{1,64}|.", part):
        if tok.isdigit():
            out.append(digits(tok))
        elif tok.isalpha():
            out.append(tok)
        else:
            out.append(_SYMBOL_WORDS.get(tok, ""))
    return " ".join(w for w in out if w)


_SYMBOL_WORDS: Final = {
    ".": "dot",
    "-": "dash",
    "_": "underscore",
    "+": "plus",
    "/": "slash",
    "@": "at",
    "~": "tilde",
    "%": "percent",
    "#": "hash",
    "&": "and",
    "=": "equals",
    "?": "",
    ":": "",
}


def _email(m: re.Match[str], _: str) -> str:
    local, _, host = m.group().partition("@")
    return _spell_word(local) + " at " + _spell_word(host)


def _url(m: re.Match[str], _: str) -> str | None:
    url = m.group()
    url = re.sub(r"^https?://", "", url)
    url = url.rstrip(".,;:!?")
    url = url.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    if url.startswith("www."):
        url = url[4:]
    spoken = _spell_word(url)
    # trailing punctuation that the match swallowed stays spoken as punctuation
    tail = m.group()[len(m.group().rstrip(".,;:!?")) :]
    return spoken + tail


def _domain(m: re.Match[str], _: str) -> str:
    return _spell_word(m.group().rstrip("/"))


def _phone(m: re.Match[str], _: str) -> str:
    groups = re.findall(r"\+?\d{1,4}", m.group())
    parts: list[str] = []
    for g in groups:
        if g.startswith("+"):
            parts.append("plus " + digits(g))
        else:
            parts.append(digits(g))
    return ", ".join(parts)


def _date(month: int, day: int, yr: str | None) -> str | None:
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    spoken = f"{MONTHS[month - 1]} {ordinal(day)}"
    if yr:
        spoken += ", " + year(int(yr))
    return spoken


def _iso_date(m: re.Match[str], _: str) -> str | None:
    return _date(int(_sub(m, 2)), int(_sub(m, 3)), _sub(m, 1))


def _slash_date(m: re.Match[str], _: str) -> str | None:
    return _date(int(_sub(m, 1)), int(_sub(m, 2)), _sub(m, 3))


def _month_date(m: re.Match[str], _: str) -> str | None:
    month = _MONTH_ABBR[
        _sub(m, 1)[:4].lower() if _sub(m, 1).lower().startswith("sept") else _sub(m, 1)[:3].lower()
    ]
    return _date(month + 1, int(_sub(m, 2)), _sub(m, 3) or None)


def _clock(h: int, mi: int, ampm: str) -> str | None:
    if h > 24 or mi > 59:
        return None
    words = cardinal(h)
    if mi == 0:
        words += "" if ampm else " hundred" if h > 12 or h == 0 else " o'clock"
    elif mi < 10:
        words += " oh " + cardinal(mi)
    else:
        words += " " + cardinal(mi)
    if ampm:
        words += " " + ("AM" if ampm.lower() == "a" else "PM")
    return words


def _time(m: re.Match[str], _: str) -> str | None:
    spoken = _clock(int(_sub(m, 1)), int(_sub(m, 2)), _sub(m, 4))
    if spoken is not None and _sub(m, 3):
        spoken += " and " + cardinal(int(_sub(m, 3))) + " seconds"
    return spoken


def _time_ampm(m: re.Match[str], _: str) -> str | None:
    h = int(_sub(m, 1))
    if not 1 <= h <= 12:
        return None
    return cardinal(h) + " " + ("AM" if _sub(m, 2).lower() == "a" else "PM")


def _money(m: re.Match[str], _: str) -> str:
    neg, sym, amount = _sub(m, 1) or _sub(m, 3), _sub(m, 2), _sub(m, 4)
    scale = (_sub(m, 5) or _sub(m, 6)).lower()
    one, many, cent, cents = _CURRENCY[sym]
    prefix = "minus " if neg else ""
    if scale:
        word = _SCALE_WORDS.get(scale, scale)
        return f"{prefix}{number(amount)} {word} {many}"
    whole, _, frac = amount.partition(".")
    spoken_whole = number(whole)
    unit = one if _is_one(whole) else many
    if frac and cent:
        frac = (frac + "0")[:2] if len(frac) <= 2 else frac
        if len(frac) == 2:
            c = int(frac)
            cent_words = f"{cardinal(c)} {cent if c == 1 else cents}"
            if _int(whole) == 0:
                return prefix + cent_words
            if c == 0:
                return f"{prefix}{spoken_whole} {unit}"
            return f"{prefix}{spoken_whole} {unit} and {cent_words}"
        return f"{prefix}{number(amount)} {many}"
    if frac:
        return f"{prefix}{number(amount)} {many}"
    return f"{prefix}{spoken_whole} {unit}"


def _cents(m: re.Match[str], _: str) -> str:
    c = int(_sub(m, 1))
    return f"{cardinal(c)} {'cent' if c == 1 else 'cents'}"


def _version(m: re.Match[str], _: str) -> str:
    if _sub(m, 1):
        return "version " + " point ".join(cardinal(int(p)) for p in _sub(m, 1).split("."))
    return " point ".join(cardinal(int(p)) for p in _sub(m, 2).split("."))


def _signed(sign: str, amount: str) -> str:
    return ("minus " if sign else "") + number(amount)


def _percent_range(m: re.Match[str], _: str) -> str:
    return f"{number(_sub(m, 1))} to {number(_sub(m, 2))} percent"


def _percent(m: re.Match[str], _: str) -> str:
    return _signed(_sub(m, 1), _sub(m, 2)) + " percent"


def _unit_words(amount: str, names: tuple[str, str]) -> str:
    return names[0] if _is_one(amount) else names[1]


def _unit_range(m: re.Match[str], _: str) -> str:
    names = _UNITS[_sub(m, 3)]
    return f"{number(_sub(m, 1))} to {number(_sub(m, 2))} {names[1]}"


def _unit(m: re.Match[str], _: str) -> str:
    amount = _sub(m, 2)
    return _signed(_sub(m, 1), amount) + " " + _unit_words(amount, _UNITS[_sub(m, 3)])


def _glued_unit(m: re.Match[str], _: str) -> str:
    amount = _sub(m, 1)
    return number(amount) + " " + _unit_words(amount, _GLUED_UNITS[_sub(m, 2)])


def _scaled(m: re.Match[str], _: str) -> str:
    return number(_sub(m, 1)) + " " + _SCALE_WORDS[_sub(m, 2).lower()]


def _ordinal(m: re.Match[str], _: str) -> str | None:
    n, suffix = int(_sub(m, 1)), _sub(m, 2)
    expected = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return ordinal(n) if suffix == expected else None


def _decade(m: re.Match[str], _: str) -> str:
    spoken = year(int(_sub(m, 1) + _sub(m, 2)))
    last = spoken.split(" ")[-1]
    stem = last[:-1] + "ie" if last.endswith("y") else last
    return " ".join([*spoken.split(" ")[:-1], stem + "s"])


def _fraction_words(num: int, den: int) -> str | None:
    if den == 0:
        return None
    if den == 1:
        return cardinal(num)
    if den == 2:
        name = "half" if num == 1 else "halves"
    elif den == 4:
        name = "quarter" if num == 1 else "quarters"
    else:
        name = ordinal(den) + ("" if num == 1 else "s")
    return f"{cardinal(num)} {name}"


def _mixed_fraction(m: re.Match[str], _: str) -> str | None:
    frac = _fraction_words(int(_sub(m, 2)), int(_sub(m, 3)))
    return None if frac is None else f"{number(_sub(m, 1))} and {frac}"


def _fraction(m: re.Match[str], _: str) -> str | None:
    return _fraction_words(int(_sub(m, 1)), int(_sub(m, 2)))


_VULGAR: Final = {"½": (1, 2), "⅓": (1, 3), "⅔": (2, 3), "¼": (1, 4), "¾": (3, 4), "⅛": (1, 8)}


def _vulgar(m: re.Match[str], text: str) -> str | None:
    frac = _fraction_words(*_VULGAR[_sub(m, 2)])
    if frac is None:
        return None
    whole = _sub(m, 1)
    if whole:
        return f"{number(whole)} and {frac}"
    after_fraction = m.start() > 0 and text[m.start() - 1] in _VULGAR
    return (" " if m.group().startswith(" ") or after_fraction else "") + frac


def _range(m: re.Match[str], _: str) -> str:
    return f"{number(_sub(m, 1))} to {number(_sub(m, 2))}"


def _year_after(m: re.Match[str], _: str) -> str:
    spoken = _sub(m, 1) + " " + year(int(_sub(m, 2)))
    end = _sub(m, 3)
    if end:  # a range of years: ``from 2020-2021``, ``in 1990–95``
        spoken += " to " + year(int(_sub(m, 2)[:2] + end if len(end) == 2 else end))
    return spoken


def _number(m: re.Match[str], _: str) -> str:
    return _signed(_sub(m, 1), _sub(m, 2))


def _abbreviation(m: re.Match[str], text: str) -> str:
    abbr = m.group()
    spoken = _ABBREVIATIONS[abbr]
    if abbr not in _TITLES and abbr.endswith(".") and _ends_sentence(text, m.end()):
        spoken += "."
    return spoken


_TITLES: Final = frozenset({"Mr.", "Mrs.", "Ms.", "Dr.", "Prof."})


def _ends_sentence(text: str, end: int) -> bool:
    rest = text[end : end + 3]
    return rest == "" or rest[:1] == "\n" or (rest[:1] == " " and rest[1:2].isupper())


def _street(m: re.Match[str], text: str) -> str | None:
    """``St.``: Street after a name (``Elm St.``), Saint before one (``St. Louis``)."""
    before = text[max(0, m.start() - 30) : m.start()].split()
    after_name = bool(before) and before[-1][:1].isupper() and before[-1].isalpha()
    before_name = text[m.end() : m.end() + 2][1:2].isupper()
    if before_name and not after_name:
        return "Saint" if m.group() == "St." else None
    dot = m.group().endswith(".") and _ends_sentence(text, m.end())
    return "Street." if dot else "Street"


def _number_sign(m: re.Match[str], _: str) -> str:
    return "number " + cardinal(int(_sub(m, 1)))


def _amp(m: re.Match[str], _: str) -> str:
    return "and"


def _times(m: re.Match[str], _: str) -> str:
    return " times "


_HANDLERS: Final[dict[str, Callable[[re.Match[str], str], str | None]]] = {
    "email": _email,
    "url": _url,
    "domain": _domain,
    "phone": _phone,
    "iso_date": _iso_date,
    "slash_date": _slash_date,
    "month_date": _month_date,
    "time": _time,
    "time_ampm": _time_ampm,
    "money": _money,
    "cents": _cents,
    "version": _version,
    "percent_range": _percent_range,
    "percent": _percent,
    "unit_range": _unit_range,
    "unit": _unit,
    "glued_unit": _glued_unit,
    "scaled": _scaled,
    "ordinal": _ordinal,
    "decade": _decade,
    "mixed_fraction": _mixed_fraction,
    "fraction": _fraction,
    "vulgar": _vulgar,
    "range": _range,
    "year_after": _year_after,
    "number": _number,
    "abbreviation": _abbreviation,
    "street": _street,
    "number_sign": _number_sign,
    "amp": _amp,
    "times": _times,
}
