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
    socket (on the event loop).  A job that holds nothing may always reserve
    one chunk, so the job being sent can always progress and a session never
    deadlocks on its own prefetched audio: the bound is ``limit_s`` plus one
    chunk.  Thread-safe."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._lock = threading.Lock()
        self._held: dict[int, float] = {}
        self._used = 0.0
        self._waiters: list[Callable[[], None]] = []

    @property
    def used_s(self) -> float:
        return self._used

    @property
    def full(self) -> bool:
        return self._used >= self.limit_s

    def reserve(self, holder: object, seconds: float, wake: Callable[[], None]) -> bool:
        """Reserve ``seconds`` for ``holder``; if the budget is full, remember
        ``wake`` (called after the next release) and return False."""
        with self._lock:
            held = self._held.get(id(holder), 0.0)
            if held > 0 and self._used + seconds > self.limit_s:
                self._waiters.append(wake)
                return False
            self._held[id(holder)] = held + seconds
            self._used += seconds
            return True

    def release(self, holder: object, seconds: float | None = None) -> None:
        """Give back ``seconds`` of ``holder``'s reservation (all of it if None)."""
        with self._lock:
            held = self._held.get(id(holder), 0.0)
            given = held if seconds is None else min(held, seconds)
            if held - given <= 1e-9:
                self._held.pop(id(holder), None)
            else:
                self._held[id(holder)] = held - given
            self._used = max(0.0, self._used - given)
            waiters, self._waiters = self._waiters, []
        for wake in waiters:
            wake()
