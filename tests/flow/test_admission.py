"""Admission (gateway.flow), without a server.  The stall rule: tests/flow/test_stall.py."""

from __future__ import annotations

import asyncio

from gateway.flow.admission import Admission


class RecordingGauge:
    def __init__(self) -> None:
        self.values: list[float] = []

    def set(self, value: float) -> None:
        self.values.append(value)


def test_try_acquire_refuses_beyond_the_limit() -> None:
    gauge = RecordingGauge()
    admission = Admission(2, gauge)
    assert admission.try_acquire()
    assert admission.try_acquire()
    assert not admission.try_acquire()
    admission.release()
    assert admission.try_acquire()
    admission.release(5)  # never below zero
    assert admission.active == 0
    assert gauge.values == [1, 2, 1, 2, 0]


def test_one_holder_takes_at_most_its_share() -> None:
    admission = Admission(4, RecordingGauge(), per_holder=2)
    a, b = object(), object()
    assert admission.try_acquire(a) and admission.try_acquire(a)
    assert admission.refusal(a) == "share" and not admission.try_acquire(a)
    assert admission.try_acquire(b) and admission.try_acquire(b)
    assert admission.refusal(object()) == "full" and not admission.try_acquire()
    admission.release(holder=a)
    assert admission.held_by(a) == 1 and admission.active == 3
    assert admission.refusal(b) == "share" and admission.refusal(a) is None
    assert admission.try_acquire()  # a slot without a holder counts only towards the limit
    admission.release(holder=a)
    admission.release(2, holder=b)
    admission.release()
    assert admission.active == 0 and admission.held_by(a) == admission.held_by(b) == 0


async def test_waiters_get_released_slots_in_order() -> None:
    admission = Admission(1, RecordingGauge())
    assert admission.try_acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        await admission.acquire()
        order.append(i)

    tasks = [asyncio.create_task(wait(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert order == [] and admission.active == 1
    assert not admission.try_acquire()  # queued waiters come first
    for expected in ([0], [0, 1], [0, 1, 2]):
        admission.release()
        await asyncio.sleep(0)
        assert order == expected
        assert admission.active == 1
    await asyncio.gather(*tasks)
    admission.release()
    assert admission.active == 0


async def test_a_cancelled_waiter_gives_its_place_back() -> None:
    admission = Admission(1, RecordingGauge())
    assert admission.try_acquire()
    waiter = asyncio.create_task(admission.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    admission.release()
    assert admission.active == 0
    assert admission.try_acquire()
