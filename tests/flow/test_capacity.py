"""Automatic admission (gateway.flow.capacity), without a server: the pure
controller table-tested with the clock passed in, the start's seed, and the
loop that applies the limit to a real ``AdmissionGate``."""

from __future__ import annotations

import asyncio

import pytest

from gateway.flow import capacity
from gateway.flow.admission import AdmissionGate, SlotQueue, Ticket
from gateway.flow.capacity import CapacityPolicy, Lateness, SlotController, seed_limit
from tests.flow.test_admission import RecordingMetrics

POLICY = CapacityPolicy(floor=1, ceiling=6, rise_every_s=0.5, hold_s=1.0, max_calm_s=4.0)
CALM = Lateness(finished=10, late=0)
LATE = Lateness(finished=10, late=1)
#: a quarter second of work in a quarter-second reading: the worker never idled
BUSY = Lateness(finished=10, late=0, busy_s=0.25)

# each step: (time, reading, slots in use, requests waiting, the limit after it)
Step = tuple[float, Lateness, int, int, int]


@pytest.mark.parametrize(
    ("start", "steps"),
    [
        pytest.param(
            2,
            [(0.0, CALM, 2, 3, 3), (0.25, CALM, 3, 2, 3), (0.5, CALM, 3, 2, 4)],
            id="rises one slot every rise_every_s while requests wait and nothing is late",
        ),
        pytest.param(
            2,
            [(0.0, CALM, 1, 0, 2), (5.0, CALM, 2, 0, 2), (9.0, CALM, 1, 3, 2)],
            id="no rise while nobody waits, or while slots are free",
        ),
        pytest.param(
            2,
            [
                (0.0, BUSY, 2, 3, 2),
                (0.25, BUSY, 2, 3, 2),
                (0.5, CALM, 2, 3, 2),
                (0.75, CALM, 2, 3, 3),
            ],
            id="no rise while the busiest worker is busy over rise_below of the last second",
        ),
        pytest.param(
            2,
            [
                (0.0, CALM, 2, 3, 3),
                (0.25, CALM, 3, 3, 3),
                (0.5, BUSY, 3, 3, 3),
                (0.75, CALM, 3, 3, 4),
            ],
            id="a busy last reading holds a rise though the average is low (a burst begins)",
        ),
        pytest.param(
            6,
            [(0.0, CALM, 6, 9, 6)],
            id="never above the ceiling",
        ),
        pytest.param(
            5,
            [(0.0, LATE, 4, 0, 3), (0.5, LATE, 4, 0, 3), (0.75, LATE, 4, 0, 3)],
            id="late work cuts to one below the streams in progress, at most once per hold",
        ),
        pytest.param(
            5,
            [
                (0.0, LATE, 4, 0, 3),
                (1.0, LATE, 3, 0, 2),
                (2.0, LATE, 2, 0, 1),
                (3.0, LATE, 1, 0, 1),
            ],
            id="lateness that lasts keeps cutting, never below the floor",
        ),
        pytest.param(
            3,
            [(0.0, LATE, 3, 4, 2), (1.5, CALM, 2, 4, 2), (2.0, CALM, 2, 4, 3)],
            id="after a cut a rise needs twice the hold of calm",
        ),
        pytest.param(
            3,
            [
                (0.0, LATE, 3, 4, 2),
                (2.0, CALM, 2, 4, 3),
                (2.25, LATE, 3, 4, 2),
                (5.0, CALM, 2, 4, 2),
                (6.25, CALM, 2, 4, 3),
            ],
            id="each cut doubles the calm a rise needs, up to max_calm_s",
        ),
        pytest.param(
            3,
            [
                (0.0, LATE, 3, 0, 2),
                (20.0, CALM, 2, 4, 3),
                (20.5, LATE, 3, 4, 2),
                (22.5, CALM, 2, 4, 3),
            ],
            id="the calm falls back to the hold after max_calm_s without late work",
        ),
    ],
)
def test_the_limit_follows_the_engines_lateness(start: int, steps: list[Step]) -> None:
    controller = SlotController(start, POLICY)
    # the first reading only starts the busy share's interval: it never rises
    assert controller.update(-0.25, CALM, start, 1) == start
    for now, reading, active, waiting, expected in steps:
        assert controller.update(now, reading, active, waiting) == expected, (now, reading)


@pytest.mark.parametrize(
    ("streams", "limit"),
    [(0.0, 1), (2.0, 1), (7.4, 2), (8.0, 2), (20.0, 5), (1000.0, 6)],
)
def test_the_start_admits_a_share_of_the_measured_real_time_streams(
    streams: float, limit: int
) -> None:
    assert seed_limit(streams, POLICY) == limit


async def test_follow_applies_the_limit_and_a_rise_grants_a_waiting_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(capacity, "TICK_S", 0.01)
    gate = AdmissionGate(SlotQueue(5, queue_length=4, deadline_s=30), RecordingMetrics())
    readings = [LATE, CALM]
    granted: list[Ticket] = []
    controller = SlotController(1, CapacityPolicy(hold_s=0.05, rise_every_s=0.05, max_calm_s=0.1))
    task = asyncio.create_task(
        capacity.follow(gate, lambda: readings.pop(0) if readings else CALM, controller)
    )
    try:
        await asyncio.sleep(0)
        assert gate.limit == 1  # the start's limit replaces the configured one
        first = gate.ask("a")
        second = gate.ask("b", notify=granted.append)
        assert (first.state, second.state) == ("granted", "waiting")
        async with asyncio.timeout(5):
            while not granted:
                await asyncio.sleep(0.01)
        assert second.state == "granted" and gate.limit == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
