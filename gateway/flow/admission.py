"""Admission: how much synthesis the server runs at once.

One ``Admission`` counts WebSocket utterances streaming at once
(``max_active_streams``, on ``gateway_streams_active``); another counts HTTP
speech responses (``max_http_streams``, on ``gateway_http_streams_active``).
A live request that finds no room is refused with ``busy`` at once
(``try_acquire``) rather than slowing everyone; batch items wait their turn
(``acquire``), first come first served.  Limits come from measured capacity.

Event-loop only (not thread-safe).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol


class Gauge(Protocol):
    """What ``Admission`` needs of a metrics gauge (prometheus ``Gauge``)."""

    def set(self, value: float) -> None: ...


class Admission:
    def __init__(self, limit: int, gauge: Gauge) -> None:
        self.limit = limit
        self.active = 0
        self._gauge = gauge
        #: ``acquire`` callers waiting for a slot, oldest first
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_acquire(self) -> bool:
        """Take a slot if one is free (and nobody is queued for it)."""
        if self.active >= self.limit or self._waiters:
            return False
        self._take()
        return True

    async def acquire(self) -> None:
        """Wait for a slot; a released slot passes straight to the oldest waiter."""
        if self.try_acquire():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over as we were cancelled
            else:
                self._waiters.remove(waiter)
            raise

    def release(self, count: int = 1) -> None:
        """Give back ``count`` slots (never below zero)."""
        for _ in range(count):
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the slot changes hands: active unchanged
                    break
            else:
                self.active = max(0, self.active - 1)
        self._gauge.set(self.active)

    def _take(self) -> None:
        self.active += 1
        self._gauge.set(self.active)
