"""Hostile text stays cheap (issue 28): Markdown bombs, ReDoS-shaped numbers,
unclosed markers, emoji runs and a long table, pushed token by token through
the segmenter and read segment by segment, in every input format.

Bounds are on this thread's CPU time (not wall time: the machine is shared)
and generous, about 10x what was measured (docs/text.md, "Cost"): they catch
a quadratic scan or a regex that backtracks, not a slow machine.  The
garbage collector is held off while measuring (a full collection of the
suite's heap, counted in this thread's time, once took a segment to 46 ms),
and a segment's reading counts its fastest of three.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

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


@pytest.fixture(autouse=True)
def _no_collection_while_timed() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _read_cpu_s(frontend: FrontEnd, segment: str) -> float:
    """The fastest of three readings of ``segment`` (this thread's CPU)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.thread_time()
        frontend.process(segment)
        best = min(best, time.thread_time() - t0)
    return best


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
        try:
            spent = _read_cpu_s(frontend, segment)
        except FrontEndError:
            break  # malformed SSML: refused, and the rest is not read
        assert spent < MAX_SEGMENT_S, (name, fmt, segment[:40])
