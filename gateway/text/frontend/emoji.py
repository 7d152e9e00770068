"""Emoji: dropped (the default) or spoken by name, with the ``emoji`` package.

A fast path skips the package when no character could start an emoji (all
code points below U+00A9), which is most segments.  A dropped emoji takes the
space before it along, so ``Great job 👍`` reads ``Great job``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import emoji as emoji_package

from gateway.text.frontend.pieces import Edit

__all__ = ["drop_emoji", "name_emoji"]

_FIRST_EMOJI: Final = 0xA9  # ©, the lowest code point the emoji package knows


def _matches(text: str) -> list[dict[str, object]]:
    if max(map(ord, text)) < _FIRST_EMOJI:
        return []
    return emoji_package.emoji_list(text)  # type: ignore[return-value]


def drop_emoji(text: str) -> Iterator[Edit]:
    runs: list[list[int]] = []
    for m in _matches(text):
        start, end = int(str(m["match_start"])), int(str(m["match_end"]))
        while end < len(text) and text[end] == "\ufe0f":
            end += 1
        if runs and not text[runs[-1][1] : start].strip():
            runs[-1][1] = end  # emoji next to emoji (spaces between): one run
        else:
            runs.append([start, end])
    for start, end in runs:
        while start > 0 and text[start - 1] == " " and (end >= len(text) or text[end] in " .,!?\n"):
            start -= 1
        yield start, end, ""


def name_emoji(text: str) -> Iterator[Edit]:
    for m in _matches(text):
        start, end = int(str(m["match_start"])), int(str(m["match_end"]))
        name = emoji_package.demojize(str(m["emoji"]), delimiters=("", "")).replace("_", " ")
        yield start, end, name
