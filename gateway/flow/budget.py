"""The session buffer: decoded but unsent audio one session may hold.

``max_buffered_ms`` becomes one ``DecodeBudget`` per WebSocket session,
passed to the engine with each streamed segment.  Thread-safe: engines
reserve from their worker threads, the session releases on the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class DecodeBudget:
    """Decoded but unsent audio a session may hold, shared by its jobs.

    Engines reserve a chunk's duration before decoding it (from their worker
    threads); the session releases it as the chunk's audio is written to the
    socket (on the event loop).  The job being sent (``sending``: one per
    audio stream of the session) may always reserve one chunk while it holds
    nothing, so it can always progress and a session never deadlocks on its
    own prefetched audio; an empty budget also takes one chunk from any job
    (the first chunk before the sender has marked its job).  Every other
    reservation waits for room: a prefetched job never passes ``limit_s``, so
    the bound is ``limit_s`` plus one chunk per job being sent.  Thread-safe.
    """

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._lock = threading.Lock()
        self._held: dict[int, float] = {}
        self._sending: set[int] = set()
        self._used = 0.0
        self._waiters: list[Callable[[], None]] = []

    @property
    def used_s(self) -> float:
        return self._used

    @property
    def full(self) -> bool:
        return self._used >= self.limit_s

    def sending(self, holder: object) -> None:
        """``holder``'s audio is being sent now (until its whole reservation
        is released): it may take a chunk past the limit while it holds
        nothing.  Wakes the jobs waiting for room, this one among them."""
        with self._lock:
            self._sending.add(id(holder))
            waiters, self._waiters = self._waiters, []
        for wake in waiters:
            wake()

    def reserve(self, holder: object, seconds: float, wake: Callable[[], None]) -> bool:
        """Reserve ``seconds`` for ``holder``; if the budget has no room for
        it, remember ``wake`` (called after the next release) and return
        False."""
        with self._lock:
            held = self._held.get(id(holder), 0.0)
            exempt = held == 0 and (id(holder) in self._sending or self._used == 0)
            if not exempt and self._used + seconds > self.limit_s:
                self._waiters.append(wake)
                return False
            self._held[id(holder)] = held + seconds
            self._used += seconds
            return True

    def release(self, holder: object, seconds: float | None = None) -> None:
        """Give back ``seconds`` of ``holder``'s reservation (all of it, and
        its mark as the job being sent, if None)."""
        with self._lock:
            held = self._held.get(id(holder), 0.0)
            given = held if seconds is None else min(held, seconds)
            if seconds is None:
                self._sending.discard(id(holder))
            if held - given <= 1e-9:
                self._held.pop(id(holder), None)
            else:
                self._held[id(holder)] = held - given
            # nothing held: exactly 0, not the float residue of many sums
            self._used = max(0.0, self._used - given) if self._held else 0.0
            waiters, self._waiters = self._waiters, []
        for wake in waiters:
            wake()
