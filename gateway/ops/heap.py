"""The C heap: malloc's parameters at start, and its free memory given back
to the system once the engine is idle.

What this module is for: under load the engine's threads (decode, acoustic,
the torch and onnxruntime pools) allocate and free tens of MiB of
activations per second across several glibc malloc arenas.  What they free
stays in the arenas, fragmented, and glibc only returns the free space at the
top of a heap: in a 4-session soak at 48 kHz, 180-380 MiB of the server's
RSS was free heap (``mallinfo2``), and it stayed after the load ended (the
"never returned" of issue 12).  ``malloc_trim(0)`` returns every free page
of every arena; once the engine has been idle for a while,
``trim_when_idle`` calls it, once per idle period (and the lifespan once
after warm-up).  Measured there: one trim under load took RSS from 1,010 to
732 MiB; 3 s after the soak's last utterance RSS was 655 MiB, where
without the trim (an earlier commit) it stayed at its level under load,
982 MiB.

Trimming under load is not the answer (see below); what kept RSS from
creeping up is ``tune_malloc``, called once at start: with glibc's defaults
every thread that allocates gets an arena of its own (up to 8 per core) and
the mmap threshold rises with every large block freed (to 32 MiB, the trim
threshold with it to 64 MiB), so the blocks the decode and acoustic threads
free land in per-thread arenas in pieces that later requests of other sizes
only partly reuse.  In the 500-utterance soak (``bench/soak.py``, 4 sessions
at 48 kHz, the vocoder's weights prepacked) the median RSS rose by 87 MiB
from the first tenth of the utterances after warm-up to the last with
glibc's defaults, and by 2.5 MiB with ``MALLOC_TUNING``: blocks of 4 MiB
and more mapped on their own (1 MiB cost 45% more CPU in the streamed
decode, from page faults; 4 MiB costs nothing measurable), the trim
threshold fixed where glibc's dynamic one would have gone, and two arenas
shared by all threads (no CPU cost measured).
Figures: ``docs/operations.md`` (Memory).  The parameters are set with
``mallopt`` before anything starts a thread (``gateway/__main__.py``: the
arena limit is read when the second arena is made, and importing numpy
starts one); a parameter given in the environment (``MALLOC_ARENA_MAX``,
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``)
is left as given.

What it must not do: trim under load (the pages it returns would be faulted
straight back in, and it holds each arena's lock while it walks it), run on
the event loop (it takes milliseconds to tens of them), or fail where there
is no glibc (it does nothing there).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Mapping
from functools import cache

log = logging.getLogger(__name__)

#: how often the engine's live jobs are sampled
IDLE_POLL_S = 0.5
#: consecutive idle samples before a trim: about a second with no job, so a
#: session between two sentences is not trimmed under it
IDLE_SAMPLES = 2


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    trim: Callable[[int], int] = function
    return trim


#: ``mallopt`` parameters (glibc's ``malloc.h``)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

#: what ``tune_malloc`` sets: parameter -> (value, its name as a glibc tunable)
MALLOC_TUNING: dict[int, tuple[int, str]] = {
    # blocks of 4 MiB and more get a mapping of their own, returned to the
    # system when freed
    M_MMAP_THRESHOLD: (4 << 20, "mmap_threshold"),
    # the free top of a heap above this is returned at once (what glibc's
    # dynamic threshold would have reached: setting either turns it off)
    M_TRIM_THRESHOLD: (64 << 20, "trim_threshold"),
    # threads share two arenas instead of one each
    M_ARENA_MAX: (2, "arena_max"),
}
_ENVIRONMENT = {
    M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_",
    M_TRIM_THRESHOLD: "MALLOC_TRIM_THRESHOLD_",
    M_ARENA_MAX: "MALLOC_ARENA_MAX",
}


@cache
def _mallopt() -> Callable[[int, int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int]
    function.restype = ctypes.c_int
    mallopt: Callable[[int, int], int] = function
    return mallopt


def _set_in_environment(param: int, environ: Mapping[str, str]) -> bool:
    tunables = environ.get("GLIBC_TUNABLES", "")
    return _ENVIRONMENT[param] in environ or f"glibc.malloc.{MALLOC_TUNING[param][1]}=" in tunables


def tune_malloc(environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """Set glibc malloc's parameters (``MALLOC_TUNING``) for the server's
    allocation pattern; call it once at start, before any thread allocates
    (the arena limit is read when the second arena is made).  A parameter
    set through the environment (``MALLOC_ARENA_MAX``,
    ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or
    ``GLIBC_TUNABLES``) is left as the operator set it.  Returns what was set
    (by tunable name); empty where the C library has no ``mallopt``.  Calling
    it again sets the same values (a no-op once set)."""
    mallopt = _mallopt()
    if mallopt is None:
        return {}
    environ = os.environ if environ is None else environ
    done: dict[str, int] = {}
    for param, (value, name) in MALLOC_TUNING.items():
        if not _set_in_environment(param, environ) and mallopt(param, value) == 1:
            done[name] = value
    return done


def trim_heap() -> bool:
    """Return the heap's free pages to the system (blocking).  False where
    the C library has no ``malloc_trim``."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


async def trim_when_idle(
    live_jobs: Callable[[], int],
    trim: Callable[[], bool] = trim_heap,
    poll_s: float = IDLE_POLL_S,
    idle_samples: int = IDLE_SAMPLES,
) -> None:
    """Until cancelled: after the engine has had work, trim once when
    ``live_jobs()`` has been 0 for ``idle_samples`` polls in a row."""
    worked = False
    idle = 0
    while True:
        await asyncio.sleep(poll_s)
        if live_jobs() > 0:
            worked = True
            idle = 0
            continue
        idle += 1
        if worked and idle >= idle_samples:
            worked = False
            if not await asyncio.to_thread(trim):
                log.debug("no malloc_trim in this C library; idle trimming off")
                return
