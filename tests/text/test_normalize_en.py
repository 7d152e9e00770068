"""English normalization: the table of cases (input -> spoken), by category.

Run through the whole front-end with ``input_format="plain"`` so spans are
built too; ``check_spans`` verifies each result's span map.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from num2words import num2words

from gateway.text.frontend import FrontEnd, FrontEndOptions
from gateway.text.frontend.normalize import normalizer_for
from gateway.text.frontend.normalize.en_words import cardinal, ordinal, year
from tests.text.spans import check_spans

CASES: list[tuple[str, str, str]] = [
    # cardinals
    ("cardinal", "0", "zero"),
    ("cardinal", "7", "seven"),
    ("cardinal", "13", "thirteen"),
    ("cardinal", "42", "forty two"),
    ("cardinal", "100", "one hundred"),
    ("cardinal", "101", "one hundred one"),
    ("cardinal", "999", "nine hundred ninety nine"),
    ("cardinal", "1000", "one thousand"),
    ("cardinal", "1,000", "one thousand"),
    ("cardinal", "1,234", "one thousand two hundred thirty four"),
    ("cardinal", "12,000", "twelve thousand"),
    ("cardinal", "1,000,000", "one million"),
    ("cardinal", "2,500,000", "two million five hundred thousand"),
    ("cardinal", "3 apples", "three apples"),
    ("cardinal", "I have 15 cats.", "I have fifteen cats."),
    ("cardinal", "Room 101.", "Room one hundred one."),
    ("cardinal", "007", "zero zero seven"),
    ("cardinal", "between 5 and 10", "between five and ten"),
    ("cardinal", "1000000000", "one billion"),
    ("cardinal", "mp3 and H2O", "mp3 and H2O"),
    # ordinals
    ("ordinal", "1st", "first"),
    ("ordinal", "2nd", "second"),
    ("ordinal", "3rd", "third"),
    ("ordinal", "4th", "fourth"),
    ("ordinal", "11th", "eleventh"),
    ("ordinal", "12th", "twelfth"),
    ("ordinal", "13th", "thirteenth"),
    ("ordinal", "21st place", "twenty first place"),
    ("ordinal", "the 22nd time", "the twenty second time"),
    ("ordinal", "100th", "one hundredth"),
    ("ordinal", "the 2th", "the 2th"),
    # decimals
    ("decimal", "3.14", "three point one four"),
    ("decimal", "0.5", "zero point five"),
    ("decimal", "2.0", "two point zero"),
    ("decimal", "1,234.5", "one thousand two hundred thirty four point five"),
    ("decimal", "pi is 3.14159", "pi is three point one four one five nine"),
    # negatives
    ("negative", "-5", "minus five"),
    ("negative", "−12", "minus twelve"),
    ("negative", "it was -3.5 today", "it was minus three point five today"),
    ("negative", "COVID-19", "COVID-nineteen"),
    # ranges
    ("range", "10-20", "ten to twenty"),
    ("range", "pages 5–10", "pages five to ten"),
    ("range", "1 - 3", "one to three"),
    ("range", "ages 18-65", "ages eighteen to sixty five"),
    # currency
    ("currency", "$5", "five dollars"),
    ("currency", "$1", "one dollar"),
    ("currency", "$1,234.56", "one thousand two hundred thirty four dollars and fifty six cents"),
    ("currency", "$0.99", "ninety nine cents"),
    ("currency", "$0.01", "one cent"),
    ("currency", "$3.50", "three dollars and fifty cents"),
    ("currency", "$3.5", "three dollars and fifty cents"),
    ("currency", "$10.00", "ten dollars"),
    ("currency", "$2.5M", "two point five million dollars"),
    ("currency", "$5K", "five thousand dollars"),
    ("currency", "$3B", "three billion dollars"),
    ("currency", "$1.2bn", "one point two billion dollars"),
    ("currency", "$4 million", "four million dollars"),
    ("currency", "€20", "twenty euros"),
    ("currency", "€1", "one euro"),
    ("currency", "€9.99", "nine euros and ninety nine cents"),
    ("currency", "£3.50", "three pounds and fifty pence"),
    ("currency", "£1", "one pound"),
    ("currency", "¥500", "five hundred yen"),
    ("currency", "50¢", "fifty cents"),
    ("currency", "-$20", "minus twenty dollars"),
    ("currency", "It costs $5.", "It costs five dollars."),
    ("currency", "from $10 to $20", "from ten dollars to twenty dollars"),
    # suffixes without currency
    ("scaled", "5K users", "five thousand users"),
    ("scaled", "1.2M downloads", "one point two million downloads"),
    ("scaled", "3B parameters", "three billion parameters"),
    # percentages
    ("percent", "50%", "fifty percent"),
    ("percent", "2.5%", "two point five percent"),
    ("percent", "100 %", "one hundred percent"),
    ("percent", "-3%", "minus three percent"),
    ("percent", "10-20%", "ten to twenty percent"),
    ("percent", "up 15% today", "up fifteen percent today"),
    # dates
    ("date", "2026-12-01", "December first, twenty twenty six"),
    ("date", "2024-02-29", "February twenty ninth, twenty twenty four"),
    ("date", "2000-01-01", "January first, two thousand"),
    ("date", "1999-07-04", "July fourth, nineteen ninety nine"),
    ("date", "12/01/2026", "December first, twenty twenty six"),
    ("date", "7/4/1776", "July fourth, seventeen seventy six"),
    ("date", "Dec 1", "December first"),
    ("date", "Dec. 25", "December twenty fifth"),
    ("date", "March 3rd", "March third"),
    ("date", "January 15, 2025", "January fifteenth, twenty twenty five"),
    ("date", "Sept 9", "September ninth"),
    ("date", "on Jun 30th", "on June thirtieth"),
    ("date", "2026-13-45", "2026-13-45"),
    ("date", "in 2026", "in twenty twenty six"),
    ("date", "since 1905", "since nineteen oh five"),
    ("date", "by 2030", "by twenty thirty"),
    ("date", "the 1990s", "the nineteen nineties"),
    ("date", "the 2000s", "the two thousands"),
    # times
    ("time", "3:45 PM", "three forty five PM"),
    ("time", "9:30PM", "nine thirty PM"),
    ("time", "10:00 AM", "ten AM"),
    ("time", "10:05", "ten oh five"),
    ("time", "14:30", "fourteen thirty"),
    ("time", "7:00", "seven o'clock"),
    ("time", "12:15 a.m.", "twelve fifteen AM"),
    ("time", "3pm", "three PM"),
    ("time", "at 11 AM", "at eleven AM"),
    ("time", "1:02:03", "one oh two and three seconds"),
    # phone numbers
    ("phone", "555-123-4567", "five five five, one two three, four five six seven"),
    ("phone", "(555) 123-4567", "five five five, one two three, four five six seven"),
    ("phone", "555.123.4567", "five five five, one two three, four five six seven"),
    ("phone", "+1 555-123-4567", "plus one, five five five, one two three, four five six seven"),
    (
        "phone",
        "call +1 (555) 123-4567 now",
        "call plus one, five five five, one two three, four five six seven now",
    ),
    # units
    ("unit", "5 kg", "five kilograms"),
    ("unit", "1 kg", "one kilogram"),
    ("unit", "2.5kg", "two point five kilograms"),
    ("unit", "10 km", "ten kilometers"),
    ("unit", "60 mph", "sixty miles per hour"),
    ("unit", "72°F", "seventy two degrees Fahrenheit"),
    ("unit", "20 °C", "twenty degrees Celsius"),
    ("unit", "-5°C", "minus five degrees Celsius"),
    ("unit", "40–60°C", "forty to sixty degrees Celsius"),
    ("unit", "90°", "ninety degrees"),
    ("unit", "16 GB", "sixteen gigabytes"),
    ("unit", "512MB", "five hundred twelve megabytes"),
    ("unit", "100ms", "one hundred milliseconds"),
    ("unit", "1 ms", "one millisecond"),
    ("unit", "5 lbs", "five pounds"),
    ("unit", "12 oz", "twelve ounces"),
    ("unit", "3 ft", "three feet"),
    ("unit", "2.4 GHz", "two point four gigahertz"),
    ("unit", "100 Mbps", "one hundred megabits per second"),
    ("unit", "5m", "five meters"),
    ("unit", "500g", "five hundred grams"),
    ("unit", "30s", "thirty seconds"),
    ("unit", "5 m away", "five m away"),
    ("unit", "10 kWh", "ten kilowatt hours"),
    # e-mail addresses
    ("email", "john.smith@example.com", "john dot smith at example dot com"),
    ("email", "write to support@acme.io.", "write to support at acme dot io."),
    ("email", "a_b+tag@mail.co.uk", "a underscore b plus tag at mail dot co dot uk"),
    ("email", "bob2@x.org", "bob two at x dot org"),
    # URLs
    ("url", "https://example.com/docs/setup", "example dot com slash docs slash setup"),
    ("url", "see https://example.com.", "see example dot com."),
    ("url", "http://www.python.org/", "python dot org"),
    ("url", "https://github.com/org/repo?tab=1", "github dot com slash org slash repo"),
    ("url", "www.google.com", "google dot com"),
    ("url", "example.com", "example dot com"),
    ("url", "docs.python.org/3/", "docs dot python dot org slash three"),
    # abbreviations in context
    ("abbreviation", "Elm St.", "Elm Street."),
    (
        "abbreviation",
        "123 Main St, Springfield",
        "one hundred twenty three Main Street, Springfield",
    ),
    ("abbreviation", "St. Louis", "Saint Louis"),
    ("abbreviation", "lives on St. Mark's Place", "lives on Saint Mark's Place"),
    ("abbreviation", "Main St. Then", "Main Street. Then"),
    ("abbreviation", "Mr. Smith", "Mister Smith"),
    ("abbreviation", "Mrs. Jones", "Missus Jones"),
    ("abbreviation", "Dr. Who", "Doctor Who"),
    ("abbreviation", "e.g. apples", "for example apples"),
    ("abbreviation", "i.e. this one", "that is this one"),
    ("abbreviation", "cats, dogs, etc.", "cats, dogs, et cetera."),
    ("abbreviation", "etc. and more", "et cetera and more"),
    ("abbreviation", "cats vs. dogs", "cats versus dogs"),
    ("abbreviation", "approx. 5", "approximately five"),
    ("abbreviation", "Sunset Blvd.", "Sunset Boulevard."),
    # version numbers
    ("version", "v3.11.2", "version three point eleven point two"),
    ("version", "v2.0", "version two point zero"),
    ("version", "1.2.3", "one point two point three"),
    ("version", "Python 3.12", "Python three point one two"),
    # fractions
    ("fraction", "1/2 cup", "one half cup"),
    ("fraction", "3/4", "three quarters"),
    ("fraction", "1/4", "one quarter"),
    ("fraction", "2/3", "two thirds"),
    ("fraction", "5/8", "five eighths"),
    ("fraction", "1 1/2 cups", "one and one half cups"),
    ("fraction", "½", "one half"),
    ("fraction", "2½", "two and one half"),
    # symbols
    ("symbol", "#1", "number one"),
    ("symbol", "salt & pepper", "salt and pepper"),
    ("symbol", "Q&A", "Q&A"),
    ("symbol", "2×3", "two times three"),
    # left alone
    ("untouched", "snake_case", "snake_case"),
    ("untouched", "my_var", "my_var"),
    ("untouched", "x = y * 2", "x = y * two"),
    ("untouched", "x**2", "x**2"),
    ("untouched", "Hello, world!", "Hello, world!"),
    ("untouched", "", ""),
    # issue 28: readings that were wrong on main
    ("date", "Pay by 2026-12-01.", "Pay by December first, twenty twenty six."),
    ("year", "since 2020-2021", "since twenty twenty to twenty twenty one"),
    ("year", "in 1990\u201395", "in nineteen ninety to nineteen ninety five"),
    (
        "currency",
        "$1,234,567,890,123,456.78",
        "one quadrillion two hundred thirty four trillion five hundred sixty seven billion"
        " eight hundred ninety million one hundred twenty three thousand four hundred"
        " fifty six dollars and seventy eight cents",
    ),
    ("currency", "$1,000,000,000,000,000,000,000", "$1,000,000,000,000,000,000,000"),
    ("currency", "$-5", "minus five dollars"),
    ("currency", "-$5", "minus five dollars"),
    ("range", "5--10", "five to ten"),
    ("range", "5--10%", "five to ten percent"),
    ("negative", "COVID-19", "COVID-nineteen"),
    ("fraction", "½½½", "one half one half one half"),
    ("fraction", "2½½", "two and one half one half"),
    ("cardinal", "1\u200d000", "one thousand"),
    (
        "cardinal",
        "12\u200b345 and 1\u00ad5",
        "twelve thousand three hundred forty five and fifteen",
    ),
    ("cardinal", "\u0663 apples", "three apples"),
    ("cardinal", "\uff11\uff12\uff13 yen", "one hundred twenty three yen"),
    ("cardinal", "\u0661\u0662 and 5", "twelve and five"),
    ("url", "See https://example.com/x\u00b2 now.", "See example dot com slash x two now."),
    ("url", "https://e.co/\u2460", "e dot co slash one"),
    ("url", "www.e.co/\u2460\u00b2", "e dot co slash one two"),
]


def speak(text: str) -> str:
    fe = FrontEnd(FrontEndOptions(input_format="plain"))
    seg = fe.process(text)
    check_spans(seg)
    return seg.text


def test_the_table_has_150_cases_over_every_category() -> None:
    assert len(CASES) >= 150
    assert {c for c, _, _ in CASES} >= {
        "cardinal", "ordinal", "decimal", "negative", "range", "currency", "percent",
        "date", "time", "phone", "unit", "email", "url", "abbreviation", "version", "fraction",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("category", "written", "spoken"), CASES, ids=[c[1] or "empty" for c in CASES]
)
def test_normalization(category: str, written: str, spoken: str) -> None:
    assert speak(written) == spoken


def _num2words_us(text: str) -> str:
    return re.sub(r" and ", " ", text.replace(",", "").replace("-", " "))


@given(st.integers(min_value=0, max_value=10**21 - 1))
def test_cardinal_and_ordinal_agree_with_num2words(n: int) -> None:
    assert cardinal(n) == _num2words_us(num2words(n))
    assert ordinal(n) == _num2words_us(num2words(n, to="ordinal"))


@pytest.mark.parametrize("n", [1905, 1999, 2026, 2010, 1100, 1776])
def test_year_agrees_with_num2words(n: int) -> None:
    assert year(n) == num2words(n, to="year").replace("-", " ")


def test_normalizer_registry_by_language_tag() -> None:
    assert normalizer_for("en") is normalizer_for("en-US") is normalizer_for("en_GB")
    assert normalizer_for("xx") is None


@pytest.mark.parametrize(
    ("language", "written", "spoken"),
    [
        (
            "de",
            "Es kostet 21 Euro, 50 % Rabatt.",
            "Es kostet einundzwanzig Euro, fünfzig Prozent Rabatt.",
        ),
        ("fr", "J'ai 3 chats", "J'ai trois chats"),
        ("es-ES", "Tengo 100 libros", "Tengo cien libros"),
        ("de", "am 1.2.2026 um 10:30, 3,5 kg", "am 1.2.2026 um 10:30, 3,5 kg"),
    ],
)
def test_other_languages_whole_numbers(language: str, written: str, spoken: str) -> None:
    fe = FrontEnd(FrontEndOptions(input_format="plain", language=language))
    seg = fe.process(written)
    check_spans(seg)
    assert seg.text == spoken


def test_unknown_language_is_not_normalized() -> None:
    fe = FrontEnd(FrontEndOptions(language="xx"))
    assert fe.process("**$5** on 2026-12-01").text == "$5 on 2026-12-01"


def test_engine_that_normalizes_gets_markdown_only() -> None:
    fe = FrontEnd(FrontEndOptions(engine_normalizes=True))
    assert fe.process("**$5** 👍").text == "$5"


@given(st.text(alphabet="0123456789.,:/-$%€£ abcAM@x°CkgK", max_size=80))
def test_any_text_normalizes_with_exact_spans(text: str) -> None:
    fe = FrontEnd(FrontEndOptions(input_format="plain"))
    check_spans(fe.process(text))
