"""Admission (gateway.flow.admission), without a server.  The stall rule:
tests/flow/test_stall.py.

``SlotQueue`` is pure: the tests pass the clock.  ``AdmissionGate`` is
tested on the event loop for its timer, notifications and metrics."""

from __future__ import annotations

import asyncio
import math

import pytest

from gateway.flow.admission import AdmissionGate, ClientGone, Refused, SlotQueue, Ticket


class RecordingMetrics:
    def __init__(self) -> None:
        self.updates: list[tuple[int, int, int]] = []
        self.waits: list[float] = []
        self.refusals: list[str] = []

    def update(self, *, active: int, limit: int, depth: int) -> None:
        self.updates.append((active, limit, depth))

    def waited(self, seconds: float) -> None:
        self.waits.append(seconds)

    def refused(self, refusal: str) -> None:
        self.refusals.append(refusal)


# --- the pure queue -------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "queue_length", "asks", "states"),
    [
        # free slots are granted at once, then requests queue, then refused
        (2, 2, 5, ["granted", "granted", "waiting", "waiting", "refused"]),
        # no queue: refused as soon as the slots are taken (the old behaviour)
        (1, 0, 3, ["granted", "refused", "refused"]),
        # a client alone may use every slot
        (4, 0, 4, ["granted"] * 4),
    ],
)
def test_grant_queue_refuse(limit: int, queue_length: int, asks: int, states: list[str]) -> None:
    q = SlotQueue(limit, queue_length, deadline_s=1.0)
    tickets = [q.ask("alone", now=0.0) for _ in range(asks)]
    assert [t.state for t in tickets] == states
    assert q.active == min(limit, asks)
    assert q.depth == states.count("waiting")
    refused = [t for t in tickets if t.state == "refused"]
    assert all(t.refusal == "full" and t.retry_after_s == 1.0 for t in refused)


def test_a_released_slot_goes_to_the_oldest_waiter_of_one_client() -> None:
    q = SlotQueue(1, 3, deadline_s=5.0)
    held = q.ask("a", 0.0)
    waiting = [q.ask("a", 0.1 * i) for i in range(1, 4)]
    assert q.release(held, 1.0) == [waiting[0]]
    assert waiting[0].state == "granted" and waiting[0].waited_s == pytest.approx(0.9)
    assert q.active == 1 and q.depth == 2
    assert q.release(waiting[0], 2.0) == [waiting[1]]


def test_while_others_wait_slots_go_round_robin_across_clients() -> None:
    """Client ``a`` queued three before ``b`` and ``c`` queued one each: the
    freed slots go a, b, c, a, a (first come within a client)."""
    q = SlotQueue(2, 10, deadline_s=60.0)
    holding = [q.ask("a", 0.0), q.ask("a", 0.0)]  # a alone took every slot
    a1, a2, a3 = (q.ask("a", 1.0) for _ in range(3))
    b1 = q.ask("b", 2.0)
    c1 = q.ask("c", 3.0)
    order: list[Ticket] = []
    running = list(holding)
    now = 4.0
    while q.depth:
        granted = q.release(running.pop(0), now)
        order += granted
        running += granted
        now += 1
    assert order == [a1, b1, c1, a2, a3]


def test_a_client_that_starts_waiting_later_joins_the_round_at_the_back() -> None:
    q = SlotQueue(1, 10, deadline_s=60.0)
    held = q.ask("a", 0.0)
    a1, a2 = q.ask("a", 0.0), q.ask("a", 0.0)
    b1 = q.ask("b", 0.0)
    (first,) = q.release(held, 1.0)
    assert first is a1  # a goes to the back of the round, behind b
    c1 = q.ask("c", 1.5)
    assert q.release(first, 2.0) == [b1]
    assert q.release(b1, 3.0) == [a2]
    assert q.release(a2, 4.0) == [c1]


@pytest.mark.parametrize(
    ("now", "expired"),
    [(0.99, []), (1.0, ["x"]), (1.5, ["x", "y"]), (9.0, ["x", "y"])],
)
def test_the_deadline_refuses_waiters(now: float, expired: list[str]) -> None:
    q = SlotQueue(1, 5, deadline_s=1.0)
    q.ask("held", 0.0)
    x, y = q.ask("x", 0.0), q.ask("y", 0.5)
    forever = q.ask("batch", 0.0, deadline_s=math.inf)
    assert q.next_expiry() == 1.0
    gone = q.expire(now)
    assert [t.client for t in gone] == expired
    assert all(t.state == "refused" and t.refusal == "deadline" for t in gone)
    assert q.depth == 3 - len(expired)
    assert forever.state == "waiting"
    if expired == ["x", "y"]:
        assert q.next_expiry() is None  # only the batch item waits, with no deadline
    assert x.state in {"waiting", "refused"} and y.state in {"waiting", "refused"}


def test_a_withdrawn_waiter_leaves_the_queue_and_a_double_release_is_harmless() -> None:
    q = SlotQueue(1, 2, deadline_s=1.0)
    held = q.ask("a", 0.0)
    waiting = q.ask("b", 0.0)
    assert q.release(waiting, 0.1) == [] and q.depth == 0 and waiting.state == "released"
    assert q.release(held, 0.2) == [] and q.active == 0
    assert q.release(held, 0.3) == [] and q.active == 0


def test_holders_are_those_of_granted_tickets() -> None:
    q = SlotQueue(2, 4, deadline_s=1.0)
    session, other, late = object(), object(), object()
    first = q.ask("a", 0.0, session)
    q.ask("b", 0.0, other)
    q.ask("c", 0.0)  # no holder: counted, not listed
    q.ask("d", 0.0, late)
    assert q.holders() == [session, other]
    q.release(first, 0.1)
    assert q.holders() == [other]
    assert q.active == 2  # the holder-less ticket took the freed slot


def test_draining_refuses_new_tickets_but_serves_the_waiting() -> None:
    q = SlotQueue(1, 2, deadline_s=1.0)
    held = q.ask("a", 0.0)
    waiting = q.ask("b", 0.0)
    q.begin_drain()
    late = q.ask("c", 0.1)
    assert late.state == "refused" and late.refusal == "draining"
    assert q.release(held, 0.2) == [waiting]


def test_wait_false_never_queues() -> None:
    q = SlotQueue(1, 5, deadline_s=1.0)
    q.ask("a", 0.0)
    now = q.ask("b", 0.0, wait=False)
    assert now.state == "refused" and now.refusal == "full" and q.depth == 0


# --- the gate on the event loop ---------------------------------------------------


async def test_the_gate_notifies_grants_and_expiries_soon_and_keeps_metrics() -> None:
    metrics = RecordingMetrics()
    gate = AdmissionGate(SlotQueue(1, 2, deadline_s=0.05), metrics)
    decided: list[Ticket] = []
    held = gate.ask("a", notify=decided.append)
    assert held.state == "granted" and decided == []  # decided at once: not notified
    first = gate.ask("b", notify=decided.append)
    second = gate.ask("c", notify=decided.append)
    assert metrics.updates[-1] == (1, 1, 2)
    gate.release(held)
    assert first.state == "granted" and decided == []  # delivered soon, not in the caller's stack
    await asyncio.sleep(0)
    assert decided == [first]
    async with asyncio.timeout(5):
        while len(decided) < 2:
            await asyncio.sleep(0.01)
    assert decided == [first, second] and second.refusal == "deadline"
    assert metrics.refusals == ["deadline"] and metrics.updates[-1] == (1, 1, 0)
    assert len(metrics.waits) == 2 and metrics.waits[0] == 0.0
    gate.release(first)
    assert metrics.updates[-1] == (0, 1, 0)


async def test_acquire_waits_then_gets_the_slot() -> None:
    gate = AdmissionGate(SlotQueue(1, 4, deadline_s=5.0), RecordingMetrics())
    held = await gate.acquire("a")
    waiter = asyncio.create_task(gate.acquire("b"))
    await asyncio.sleep(0.01)
    assert not waiter.done() and gate.queue.depth == 1
    gate.release(held)
    ticket = await waiter
    assert ticket.state == "granted" and ticket.waited_s > 0
    gate.release(ticket)
    assert gate.active == 0


async def test_acquire_is_refused_past_the_deadline_with_retry_advice() -> None:
    gate = AdmissionGate(SlotQueue(1, 4, deadline_s=0.05), RecordingMetrics())
    await gate.acquire("a")
    with pytest.raises(Refused) as refused:
        await gate.acquire("b")
    assert refused.value.ticket.refusal == "deadline"
    assert refused.value.ticket.retry_after_s == 1.0
    assert gate.queue.depth == 0


async def test_a_cancelled_acquire_gives_its_place_back() -> None:
    gate = AdmissionGate(SlotQueue(1, 4, deadline_s=5.0), RecordingMetrics())
    held = await gate.acquire("a")
    waiter = asyncio.create_task(gate.acquire("b"))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert gate.queue.depth == 0
    gate.release(held)
    assert gate.active == 0


async def test_a_waiter_whose_client_goes_gives_its_place_to_the_next() -> None:
    gate = AdmissionGate(SlotQueue(1, 4, deadline_s=5.0), RecordingMetrics())
    held = await gate.acquire("a")
    gone = asyncio.Event()
    leaving = asyncio.create_task(gate.acquire("b", gone=gone.wait))
    staying = asyncio.create_task(gate.acquire("c", gone=asyncio.Event().wait))
    await asyncio.sleep(0.01)
    assert gate.queue.depth == 2
    gone.set()
    with pytest.raises(ClientGone):
        await leaving
    assert gate.queue.depth == 1  # only "c" waits now
    gate.release(held)
    ticket = await staying  # granted: its watch of the client ends
    assert ticket.state == "granted" and ticket.client == "c"
    gate.release(ticket)
    assert gate.active == 0 and gate.queue.depth == 0


async def test_a_slot_free_at_once_never_watches_the_client() -> None:
    gate = AdmissionGate(SlotQueue(1, 4, deadline_s=5.0), RecordingMetrics())

    async def never_called() -> None:
        raise AssertionError("watched a request that did not wait")

    ticket = await gate.acquire("a", gone=never_called)
    assert ticket.state == "granted"
    gate.release(ticket)


def test_a_higher_limit_grants_the_waiting_and_a_lower_one_stops_no_holder() -> None:
    q = SlotQueue(1, queue_length=4, deadline_s=10)
    held = q.ask("a", 0.0)
    waiting = [q.ask(c, 0.0) for c in ("b", "c", "d")]
    assert [t.state for t in waiting] == ["waiting"] * 3
    assert q.set_limit(3, 1.0) == waiting[:2]
    assert q.active == 3 and waiting[2].state == "waiting"
    assert q.set_limit(1, 2.0) == []
    assert held.state == "granted" and q.active == 3  # nobody loses a slot
    q.release(held, 3.0)
    q.release(waiting[0], 3.0)
    assert waiting[2].state == "waiting"  # two holders left, limit 1: still full
    assert q.release(waiting[1], 4.0) == [waiting[2]]  # none left: below the limit again
