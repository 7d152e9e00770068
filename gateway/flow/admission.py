"""Admission: how much synthesis the server runs at once.

One ``Admission`` counts WebSocket utterances streaming at once
(``max_active_streams``, on ``gateway_streams_active``); another counts HTTP
speech responses (``max_http_streams``, on ``gateway_http_streams_active``).
A live request that finds no room is refused with ``busy`` at once
(``try_acquire``) rather than slowing everyone; batch items wait their turn
(``acquire``), first come first served.  Limits come from measured capacity.

Holders and shares.  ``try_acquire(holder)`` also caps the slots one holder
(a WebSocket session) may hold at once at ``per_holder``
(``max_streams_per_session``), so a few clients cannot take every slot;
``release(holder=...)`` gives them back.  Slots taken without a holder
(HTTP, batch) count only towards ``limit``.

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
    def __init__(self, limit: int, gauge: Gauge, per_holder: int | None = None) -> None:
        self.limit = limit
        #: the most slots one holder may hold at once (None: no share)
        self.per_holder = per_holder
        self.active = 0
        self._gauge = gauge
        #: slots held, by holder (``id`` of the holder object)
        self._held: dict[int, int] = {}
        #: ``acquire`` callers waiting for a slot, oldest first
        self._waiters: deque[asyncio.Future[None]] = deque()

    def held_by(self, holder: object) -> int:
        return self._held.get(id(holder), 0)

    def refusal(self, holder: object | None = None) -> str | None:
        """Why ``try_acquire(holder)`` would refuse now: ``"share"`` (the
        holder holds its share), ``"full"``, or None (a slot is free)."""
        if (
            holder is not None
            and self.per_holder is not None
            and self.held_by(holder) >= self.per_holder
        ):
            return "share"
        if self.active >= self.limit or self._waiters:
            return "full"
        return None

    def try_acquire(self, holder: object | None = None) -> bool:
        """Take a slot if one is free (nobody is queued for it and ``holder``
        holds less than its share)."""
        if self.refusal(holder) is not None:
            return False
        if holder is not None:
            self._held[id(holder)] = self.held_by(holder) + 1
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

    def release(self, count: int = 1, holder: object | None = None) -> None:
        """Give back ``count`` slots (never below zero; a holder's count too)."""
        if holder is not None:
            left = self.held_by(holder) - count
            if left > 0:
                self._held[id(holder)] = left
            else:
                self._held.pop(id(holder), None)
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
