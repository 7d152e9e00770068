"""Returning free heap to the system once the engine is idle (gateway/ops/heap.py)."""

from __future__ import annotations

import asyncio
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.ops.heap import trim_heap, trim_when_idle
from tests.helpers import serve_process

FRAGMENT = """
import sys
from pathlib import Path
from gateway.ops.heap import trim_heap

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


ALLOCATOR = r"""
import ctypes, ctypes.util, json, os, sys, tempfile, threading
from gateway.ops.heap import tune_malloc

tuned = tune_malloc() if sys.argv[1] == "tune" else {}
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]


class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


libc.mallinfo2.restype = Info
# freeing a mapped 16 MiB block raises glibc's dynamic mmap threshold to 16 MiB
libc.free(libc.malloc(16 << 20))
mapped = libc.mallinfo2().hblks
block = libc.malloc(8 << 20)
mapped_8mib = libc.mallinfo2().hblks - mapped
libc.free(block)

# eight threads allocating at once: glibc gives each an arena up to its limit
barrier = threading.Barrier(8)
def work():
    barrier.wait()
    blocks = [libc.malloc(4096) for _ in range(2000)]
    barrier.wait()
    for b in blocks:
        libc.free(b)
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with tempfile.TemporaryFile("w+b") as f:
    libc.fdopen.restype = ctypes.c_void_p
    stream = libc.fdopen(os.dup(f.fileno()), b"w")
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    f.seek(0)
    arenas = f.read().count(b"<heap nr=")
print(json.dumps({"tuned": tuned, "mapped_8mib": mapped_8mib, "arenas": arenas}))
"""


def allocator(mode: str, **env: str) -> dict[str, object]:
    import json
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    done = subprocess.run(
        [sys.executable, "-c", ALLOCATOR, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**environ, **env},
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


GLIBC = platform.libc_ver()[0] == "glibc"


def test_tuned_malloc_maps_large_blocks_and_shares_two_arenas() -> None:
    """The server's malloc parameters (``tune_malloc``, set before any thread
    starts) against glibc's defaults in the same script: an 8 MiB block gets
    its own mapping (returned when freed) although a freed 16 MiB block
    raised the dynamic threshold, and eight threads share two arenas."""
    if not GLIBC:
        assert allocator("tune")["tuned"] == {}
        return
    default, tuned = allocator("default"), allocator("tune")
    assert tuned["tuned"] == {"mmap_threshold": 4 << 20, "trim_threshold": 64 << 20, "arena_max": 2}
    assert default["mapped_8mib"] == 0 and tuned["mapped_8mib"] == 1
    assert isinstance(default["arenas"], int) and default["arenas"] > 2
    assert tuned["arenas"] <= 2


def test_malloc_settings_from_the_environment_are_left_alone() -> None:
    if not GLIBC:
        return
    ours = allocator("tune", MALLOC_ARENA_MAX="8")
    assert ours["tuned"] == {"mmap_threshold": 4 << 20, "trim_threshold": 64 << 20}
    assert isinstance(ours["arenas"], int) and ours["arenas"] > 2
    tunables = allocator("tune", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=33554432")
    assert tunables["tuned"] == {"trim_threshold": 64 << 20, "arena_max": 2}
    assert tunables["mapped_8mib"] == 0  # the operator's 32 MiB threshold holds


def test_the_server_tunes_malloc_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m gateway serve`` applies ``tune_malloc`` (and says so in
    its log); a parameter from the environment is left to the environment."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with serve_process(tmp_path / "a", engine="synthetic") as server:
        tuned = server.output()
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    with serve_process(tmp_path / "b", engine="synthetic") as server:
        partly = server.output()
    if not GLIBC:
        assert "malloc: as configured" in tuned
        return
    assert "malloc: mmap_threshold=4194304, trim_threshold=67108864, arena_max=2" in tuned
    assert "malloc: mmap_threshold=4194304, trim_threshold=67108864\n" in partly
