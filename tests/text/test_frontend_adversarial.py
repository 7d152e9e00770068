"""Hostile text stays cheap (issue 28): Markdown bombs, ReDoS-shaped numbers,
unclosed markers, emoji runs and a long table, pushed token by token through
the segmenter and read segment by segment, in every input format.

Bounds are on this thread's CPU time (not wall time: the machine is shared)
and generous, about 10x what was measured (docs/text.md, "Cost"): they catch
a quadratic scan or a regex that backtracks, not a slow machine.
"""

from __future__ import annotations

import time

import pytest

from gateway.text.frontend import FrontEnd, FrontEndError, FrontEndOptions, InputFormat
from gateway.text.segmenter import Segmenter

HOSTILE = {
    "quotes": ">" * 3000,
    "stars": "*" * 3000,
    "brackets": "[" * 3000,
    "unclosed emphasis": "*a " * 1000,
    "unclosed tags": "<a " * 1000,
    "backticks": "`a " * 1000,
    "backslashes": "\\" * 3000,
    "links": "[a](" * 750,
    "dashed ones": "1-" * 1500,
    "grouped numbers": "777,777,777,777,777 " * 9 + "end.",
    "emoji": "\U0001f44d" * 600,
    "table": "| " + "h" * 250 + " |\n|---|\n" + "| x |\n" * 500,
}
MAX_PUSH_S = 0.010
MAX_SEGMENT_S = 0.030


@pytest.mark.parametrize("fmt", ["markdown", "ssml", "plain"])
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_text_is_cut_and_read_in_bounded_time(name: str, fmt: InputFormat) -> None:
    text = HOSTILE[name]
    segmenter = Segmenter("auto", input_format=fmt)
    segments: list[str] = []
    worst_push = 0.0
    for i in range(0, len(text), 4):
        t0 = time.thread_time()
        segments += segmenter.push(text[i : i + 4])
        worst_push = max(worst_push, time.thread_time() - t0)
    segments += segmenter.flush()
    assert worst_push < MAX_PUSH_S, (name, fmt, worst_push)
    assert all(len(s) <= 300 for s in segments)
    frontend = FrontEnd(FrontEndOptions(input_format=fmt, emoji="name"))
    for segment in segments:
        t0 = time.thread_time()
        try:
            frontend.process(segment)
        except FrontEndError:
            break  # malformed SSML: refused, and the rest is not read
        assert time.thread_time() - t0 < MAX_SEGMENT_S, (name, fmt, segment[:40])
