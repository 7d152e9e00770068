"""Admission: how much synthesis the server runs at once, and who waits.

One mechanism for both surfaces: a ``SlotQueue`` counts admitted WebSocket
sessions (``max_active_streams``: a session is admitted once, at its first
committed text, and keeps its slot until it ends; ``gateway.session.core``)
and another HTTP speech responses (``max_http_streams``).  In front of the
slots sits a bounded queue with a deadline: a request that finds every slot taken waits (at most
``admission_queue_length`` requests wait per surface, each at most
``admission_deadline_s``) rather than being refused at once; past the
deadline, with the queue full or while the server drains, it is refused
with ``busy`` and retry advice (``retry_after_s``).

Fairness is work-conserving.  A client (an address, or an agent key when one
is presented) alone may use every slot: a request takes a free slot at once
whenever nobody waits.  While requests wait, each freed slot goes to the next
client in round-robin order among the clients with a waiting request (the
order in which they began waiting), first come first served within a
client.  The share: with ``k`` clients waiting, each receives every ``k``-th
freed slot, whatever it already holds, so as holders finish the slots
converge to ``limit / k`` each; a client with one request waiting is never
behind more than ``k - 1`` grants.

Holders.  A ticket may name a holder (a WebSocket session): ``holders``
lists those of the granted tickets (the capacity follower asks which of the
admitted sessions speak).

``SlotQueue`` is pure (no clock, no I/O, no asyncio: the caller passes
``now``), table-tested in ``tests/flow/test_admission.py``.  ``AdmissionGate``
is the thin event-loop layer: it reads the clock, arms one timer for the
earliest deadline, tells a ticket's owner of its grant or refusal
(``Ticket.notify``, called soon on the loop, never inside the caller's
stack) and keeps the surface's metrics.  Event-loop only (not thread-safe).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

#: why a ticket was refused: ``full`` (every slot taken and the queue full, or
#: no queue), ``deadline`` (it waited ``deadline_s``), ``draining`` (the
#: server is shutting down)
Refusal = Literal["full", "deadline", "draining"]
TicketState = Literal["waiting", "granted", "refused", "released"]


@dataclass(eq=False)
class Ticket:
    """One request for a slot."""

    client: str
    asked_at: float
    #: refused when still waiting at this time (``math.inf``: waits as long as needed)
    expires_at: float
    holder: object | None = None
    #: called (by ``AdmissionGate``) once the ticket is granted or refused after waiting
    notify: Callable[[Ticket], None] | None = None
    state: TicketState = "waiting"
    refusal: Refusal | None = None
    #: when it left the queue (granted or refused)
    decided_at: float | None = None
    #: a suggested wait before retrying, when refused
    retry_after_s: float = 0.0

    @property
    def waited_s(self) -> float:
        return 0.0 if self.decided_at is None else self.decided_at - self.asked_at


class SlotQueue:
    """Slots, a bounded queue with a deadline in front of them, and
    round-robin grants across clients.  Pure: every method takes ``now``."""

    def __init__(
        self,
        limit: int,
        queue_length: int = 0,
        deadline_s: float = 0.0,
    ) -> None:
        self.limit = limit
        self.queue_length = queue_length
        self.deadline_s = deadline_s
        self.active = 0
        self.draining = False
        #: waiting tickets by client; key order is the round-robin order
        self._waiting: dict[str, deque[Ticket]] = {}
        self._depth = 0
        #: granted tickets (insertion-ordered)
        self._granted: dict[Ticket, None] = {}

    # -- reading -------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Tickets waiting."""
        return self._depth

    def holders(self) -> list[object]:
        """The holders of the granted tickets that name one."""
        return [t.holder for t in self._granted if t.holder is not None]

    @property
    def retry_after_s(self) -> float:
        """The retry advice of a refusal: the queue's deadline, at least a second
        (a slot frees when an utterance ends: seconds, not milliseconds)."""
        return max(1.0, math.ceil(self.deadline_s))

    def refusal(self, *, wait: bool = True) -> Refusal | None:
        """Why ``ask`` would refuse now (None: it would grant or queue)."""
        if self.draining:
            return "draining"
        if self.active < self.limit and not self._depth:
            return None
        if not wait or self._depth >= self.queue_length:
            return "full"
        return None

    def next_expiry(self) -> float | None:
        """The earliest deadline of a waiting ticket (None: none waits with one)."""
        times = [t.expires_at for q in self._waiting.values() for t in q]
        earliest = min(times, default=math.inf)
        return None if math.isinf(earliest) else earliest

    # -- changing --------------------------------------------------------------
    def ask(
        self,
        client: str,
        now: float,
        holder: object | None = None,
        *,
        wait: bool = True,
        deadline_s: float | None = None,
        notify: Callable[[Ticket], None] | None = None,
    ) -> Ticket:
        """A ticket for a slot: ``granted`` at once, ``waiting`` in the queue,
        or ``refused``.  ``wait=False`` never queues; ``deadline_s`` overrides
        the queue's (``math.inf``: wait as long as needed, for batch items,
        still bounded by the queue's length)."""
        deadline = self.deadline_s if deadline_s is None else deadline_s
        ticket = Ticket(client, now, now + deadline, holder, notify)
        refusal = self.refusal(wait=wait)
        if refusal is not None:
            self._refuse(ticket, refusal, now)
            return ticket
        if self.active < self.limit and not self._depth:
            self._grant(ticket, now)
        else:
            self._waiting.setdefault(client, deque()).append(ticket)
            self._depth += 1
        return ticket

    def release(self, ticket: Ticket, now: float) -> list[Ticket]:
        """Give back a ticket: a granted one frees its slot, a waiting one
        leaves the queue.  Returns the tickets granted as a result."""
        if ticket.state == "waiting":
            self._unqueue(ticket)
            ticket.state = "released"
            return []
        if ticket.state != "granted":
            return []
        ticket.state = "released"
        self._granted.pop(ticket, None)
        self.active = max(0, self.active - 1)
        return self._fill(now)

    def expire(self, now: float) -> list[Ticket]:
        """Refuse (``deadline``) every waiting ticket whose deadline passed."""
        expired = [t for q in self._waiting.values() for t in q if t.expires_at <= now]
        for ticket in expired:
            self._unqueue(ticket)
            self._refuse(ticket, "deadline", now)
        return expired

    def begin_drain(self) -> None:
        """Refuse new tickets with ``draining``; those waiting still get slots."""
        self.draining = True

    def set_limit(self, limit: int, now: float) -> list[Ticket]:
        """Change the number of slots (automatic admission,
        ``gateway.flow.capacity``).  A lower limit stops no holder: grants wait
        until enough have released.  Returns the tickets a higher one grants."""
        self.limit = max(1, limit)
        return self._fill(now)

    # -- inside ------------------------------------------------------------------
    def _fill(self, now: float) -> list[Ticket]:
        granted: list[Ticket] = []
        while self.active < self.limit and self._waiting:
            client = next(iter(self._waiting))
            queue = self._waiting.pop(client)
            ticket = queue.popleft()
            self._depth -= 1
            if queue:  # the client goes to the back of the round
                self._waiting[client] = queue
            self._grant(ticket, now)
            granted.append(ticket)
        return granted

    def _grant(self, ticket: Ticket, now: float) -> None:
        self.active += 1
        self._granted[ticket] = None
        ticket.state = "granted"
        ticket.decided_at = now

    def _refuse(self, ticket: Ticket, refusal: Refusal, now: float) -> None:
        ticket.state = "refused"
        ticket.refusal = refusal
        ticket.decided_at = now
        ticket.retry_after_s = self.retry_after_s

    def _unqueue(self, ticket: Ticket) -> None:
        queue = self._waiting[ticket.client]
        queue.remove(ticket)
        self._depth -= 1
        if not queue:
            del self._waiting[ticket.client]


class AdmissionMetrics(Protocol):
    """What the gate reports (``gateway.ops.metrics.SurfaceAdmission``)."""

    def update(self, *, active: int, limit: int, depth: int) -> None: ...

    def waited(self, seconds: float) -> None: ...

    def refused(self, refusal: Refusal) -> None: ...


class Refused(Exception):
    """``AdmissionGate.acquire`` was refused; ``ticket`` says why."""

    def __init__(self, ticket: Ticket) -> None:
        super().__init__(ticket.refusal)
        self.ticket = ticket


class ClientGone(Exception):
    """``AdmissionGate.acquire``'s client went away while it waited."""


class AdmissionGate:
    """A ``SlotQueue`` on the event loop: clock, deadline timer, notifications, metrics."""

    def __init__(
        self,
        queue: SlotQueue,
        metrics: AdmissionMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.queue = queue
        self._metrics = metrics
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._report()

    @property
    def limit(self) -> int:
        return self.queue.limit

    @property
    def active(self) -> int:
        return self.queue.active

    @property
    def depth(self) -> int:
        return self.queue.depth

    def refusal(self) -> Refusal | None:
        return self.queue.refusal()

    def ask(
        self,
        client: str,
        holder: object | None = None,
        *,
        wait: bool = True,
        deadline_s: float | None = None,
        notify: Callable[[Ticket], None] | None = None,
    ) -> Ticket:
        """``SlotQueue.ask`` now; a waiting ticket's ``notify`` is called on
        its grant or refusal.  A ticket decided at once is not notified."""
        ticket = self.queue.ask(
            client, self._clock(), holder, wait=wait, deadline_s=deadline_s, notify=notify
        )
        if ticket.state == "granted":
            self._metrics.waited(0.0)
        elif ticket.state == "refused":
            assert ticket.refusal is not None
            self._metrics.refused(ticket.refusal)
        self._settle([], [])
        return ticket

    def release(self, ticket: Ticket) -> None:
        """Give back a granted or waiting ticket (twice is harmless)."""
        self._settle(self.queue.release(ticket, self._clock()), [])

    async def acquire(
        self,
        client: str,
        *,
        deadline_s: float | None = None,
        gone: Callable[[], Awaitable[object]] | None = None,
    ) -> Ticket:
        """Wait for a slot (the HTTP surface); raises ``Refused``.  The caller
        releases the granted ticket; a cancelled wait leaves the queue.
        ``gone``: what completes when the client has gone away; watched only
        while the ticket waits, it ends the wait with ``ClientGone`` (the
        ticket leaves the queue)."""
        decided = asyncio.get_running_loop().create_future()

        def notify(ticket: Ticket) -> None:
            if not decided.done():
                decided.set_result(None)

        ticket = self.ask(client, deadline_s=deadline_s, notify=notify)
        if ticket.state == "waiting":
            watcher = asyncio.ensure_future(gone()) if gone is not None else None
            try:
                if watcher is None:
                    await decided
                else:
                    await asyncio.wait((decided, watcher), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                self.release(ticket)  # waiting: leaves the queue; granted meanwhile: frees it
                raise
            finally:
                if watcher is not None:
                    watcher.cancel()
                    if watcher.done() and not watcher.cancelled():
                        watcher.exception()  # retrieved: a failed watch is a disconnect too
            if not decided.done():
                self.release(ticket)
                raise ClientGone
        if ticket.state != "granted":
            raise Refused(ticket)
        return ticket

    def begin_drain(self) -> None:
        self.queue.begin_drain()

    def set_limit(self, limit: int) -> None:
        """``SlotQueue.set_limit`` now, telling the tickets it grants."""
        self._settle(self.queue.set_limit(limit, self._clock()), [])

    def _settle(self, granted: list[Ticket], expired: list[Ticket]) -> None:
        loop = asyncio.get_running_loop() if (granted or expired or self.queue.depth) else None
        for ticket in granted:
            self._metrics.waited(ticket.waited_s)
        for _ in expired:
            self._metrics.refused("deadline")
        for ticket in [*granted, *expired]:
            if ticket.notify is not None and loop is not None:
                loop.call_soon(ticket.notify, ticket)
        self._arm(loop)
        self._report()

    def _arm(self, loop: asyncio.AbstractEventLoop | None) -> None:
        at = self.queue.next_expiry()
        if at is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer, self._timer_at = None, math.inf
            return
        if at >= self._timer_at and self._timer is not None:
            return  # the armed timer fires first and re-arms
        if self._timer is not None:
            self._timer.cancel()
        assert loop is not None
        # the loop's clock is time.monotonic, as the gate's default clock is
        self._timer = loop.call_at(at, self._expire)
        self._timer_at = at

    def _expire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        self._settle([], self.queue.expire(self._clock()))

    def _report(self) -> None:
        q = self.queue
        self._metrics.update(active=q.active, limit=q.limit, depth=q.depth)
