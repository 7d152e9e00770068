"""Returning free heap to the system once the engine is idle (gateway/heap.py)."""

from __future__ import annotations

import asyncio
import platform
import subprocess
import sys
from collections.abc import Iterator

from gateway.heap import trim_heap, trim_when_idle

FRAGMENT = """
import sys
from pathlib import Path
from gateway.heap import trim_heap

def rss_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

blocks = [bytearray(64 * 1024) for _ in range(3000)]  # below the mmap threshold
guard = bytearray(64 * 1024)  # above them on the heap: its top cannot shrink
del blocks
before = rss_mib()
trimmed = trim_heap()
print(before, rss_mib(), trimmed)
"""


def test_trim_returns_the_free_heap_below_live_memory() -> None:
    """~190 MiB freed under a live block stays resident until the trim."""
    out = subprocess.run(
        [sys.executable, "-c", FRAGMENT], capture_output=True, text=True, check=True
    ).stdout.split()
    before, after, trimmed = float(out[0]), float(out[1]), out[2] == "True"
    if platform.libc_ver()[0] != "glibc":
        assert not trimmed  # nothing to call there
        return
    assert trimmed
    assert before - after >= 150, (before, after)


def scripted(counts: list[int]) -> Iterator[int]:
    yield from counts
    while True:
        yield 0


async def run_until_idle(counts: list[int], polls: int) -> list[int]:
    """Poll indices at which a trim ran, over ``polls`` polls."""
    script = scripted(counts)
    polled = 0
    trims: list[int] = []

    def live_jobs() -> int:
        nonlocal polled
        polled += 1
        return next(script)

    def trim() -> bool:
        trims.append(polled)
        return True

    task = asyncio.create_task(trim_when_idle(live_jobs, trim, poll_s=0.001, idle_samples=2))
    while polled < polls:
        await asyncio.sleep(0.001)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return trims


async def test_trims_once_per_idle_period_after_work() -> None:
    # work, one idle poll (a pause between sentences), work, then idle
    trims = await run_until_idle([1, 2, 0, 1, 0, 0, 0, 0, 3, 0, 0, 0], polls=30)
    assert trims == [6, 11]  # the second idle poll after each burst, once each


async def test_never_trims_without_work() -> None:
    assert await run_until_idle([], polls=20) == []


async def test_stops_where_there_is_no_malloc_trim() -> None:
    calls = 0

    def absent() -> bool:
        nonlocal calls
        calls += 1
        return False

    task = asyncio.create_task(
        trim_when_idle(iter([1, 0, 0, 1, 0, 0, 0] + [0] * 100).__next__, absent, poll_s=0.001)
    )
    await asyncio.wait_for(task, 1.0)  # returns instead of polling forever
    assert calls == 1


def test_trim_heap_is_safe_to_call_repeatedly() -> None:
    assert trim_heap() == trim_heap()
