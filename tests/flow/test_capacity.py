"""Automatic admission's door (gateway.flow.capacity), without a server: the
pure controller table-tested with the clock passed in, the start's seed, and
the loop that applies the limit to a real ``AdmissionGate``."""

from __future__ import annotations

import asyncio

import pytest

from gateway.flow import capacity
from gateway.flow.admission import AdmissionGate, SlotQueue, Ticket
from gateway.flow.capacity import CapacityPolicy, DoorController, Lateness, seed_capacity
from tests.flow.test_admission import RecordingMetrics

POLICY = CapacityPolicy(
    floor=1,
    ceiling=40,
    tight_s=0.1,
    ample_s=0.3,
    window=20,
    min_samples=10,
    cut_factor=0.8,
    hold_s=2.0,
    rise_every_s=1.0,
    rise_step=0.5,
    prior_share=1.0,
    min_share=0.25,
    share_average_s=10.0,
    speaking_average_s=1.0,
    max_overcommit=1.5,
)


def slack(*values: float) -> Lateness:
    return Lateness(finished=len(values), slack_s=values)


AMPLE = slack(*[0.5] * 10)
TIGHT = slack(*[0.02] * 10)
#: one late item among ten: the 10th percentile is the second lowest
ONE_LATE = slack(-0.4, *[0.5] * 9)

# each step: (time, reading, admitted, speaking, waiting, the limit after it)
Step = tuple[float, Lateness, int, int, int, int]


@pytest.mark.parametrize(
    ("start", "steps"),
    [
        pytest.param(
            4.0,
            [(0.0, AMPLE, 4, 4, 2, 4), (1.0, AMPLE, 4, 4, 2, 5), (2.0, AMPLE, 5, 5, 2, 5)],
            id="ample slack with sessions waiting: capacity rises half a stream a second",
        ),
        pytest.param(
            4.0,
            [(0.0, AMPLE, 3, 3, 0, 4), (5.0, AMPLE, 4, 4, 0, 4)],
            id="no rise while nobody waits at the door",
        ),
        pytest.param(
            6.0,
            [
                (0.0, AMPLE, 6, 4, 2, 6),
                (1.0, AMPLE, 6, 4, 2, 6),
                (2.0, AMPLE, 6, 6, 2, 6),
                (3.0, AMPLE, 6, 6, 2, 7),
            ],
            id="no rise while the capacity is not in use (admitted sessions not speaking yet)",
        ),
        pytest.param(
            4.0,
            [
                (0.0, AMPLE, 4, 4, 2, 4),
                (1.0, slack(*[0.5] * 5), 4, 4, 2, 4),
                (2.0, slack(*[0.5] * 5), 4, 4, 2, 5),
            ],
            id="each rise reads fresh evidence: the window starts again",
        ),
        pytest.param(
            8.0,
            [(0.0, ONE_LATE, 8, 8, 3, 8), (0.25, ONE_LATE, 8, 8, 3, 8)],
            id="one late item among many moves nothing",
        ),
        pytest.param(
            8.0,
            [(0.0, TIGHT, 6, 6, 0, 4), (0.5, TIGHT, 4, 4, 0, 4), (2.0, TIGHT, 4, 4, 0, 3)],
            id="tight slack cuts to a share of the streams speaking, at most once per hold",
        ),
        pytest.param(
            8.0,
            [(0.0, slack(0.02, 0.02, 0.02), 8, 8, 0, 8)],
            id="no decision on too few samples",
        ),
        pytest.param(
            4.0,
            [(0.0, TIGHT, 0, 0, 0, 4), (3.0, TIGHT, 0, 0, 0, 4)],
            id="no cut while nobody speaks (the late work was of sessions gone)",
        ),
        pytest.param(
            4.0,
            [(0.0, slack(*[0.2] * 10), 4, 4, 5, 4), (3.0, slack(*[0.2] * 10), 4, 4, 5, 4)],
            id="between the thresholds it holds (hysteresis)",
        ),
        pytest.param(
            2.0,
            [(0.0, TIGHT, 2, 2, 0, 1), (2.0, TIGHT, 1, 1, 0, 1), (4.0, TIGHT, 1, 1, 0, 1)],
            id="never below the floor",
        ),
        pytest.param(
            4.0,
            [(0.0, TIGHT, 4, 4, 3, 3), (1.0, AMPLE, 3, 3, 3, 3), (2.0, AMPLE, 3, 3, 3, 3)],
            id="no rise within the hold after a cut",
        ),
    ],
)
def test_capacity_follows_the_slack_of_the_engines_work(start: float, steps: list[Step]) -> None:
    controller = DoorController(start, POLICY)
    for now, reading, admitted, speaking, waiting, expected in steps:
        got = controller.update(now, reading, admitted, speaking, waiting)
        assert got == expected, (now, controller.capacity, controller.slack_p10)


def test_sessions_that_speak_little_count_for_little() -> None:
    """Twenty admitted agents of which four speak: the share falls to a
    fifth and the door admits capacity / share, capped by the overcommit."""
    controller = DoorController(4.0, POLICY)
    assert controller.limit == 4  # the prior share: every session speaks
    now = 0.0
    for _ in range(200):
        now += 0.25
        controller.update(now, Lateness(), 20, 4, 0)
    assert controller.share == pytest.approx(0.2, abs=0.01)
    # 4 / 0.25 (min_share) = 16, but at most 1.5 x 4 = 6
    assert controller.limit == 6 and controller.overcommit == pytest.approx(1.5)


def test_an_idle_server_keeps_its_door() -> None:
    controller = DoorController(5.0, POLICY)
    for i in range(100):
        assert controller.update(i * 0.25, Lateness(), 0, 0, 0) == 5


@pytest.mark.parametrize(
    ("streams", "capacity_streams"),
    [(0.0, 1.0), (1.0, 1.0), (7.4, 3.7), (12.4, 6.2)],
)
def test_the_start_assumes_half_the_measured_real_time_streams(
    streams: float, capacity_streams: float
) -> None:
    assert seed_capacity(streams, POLICY) == pytest.approx(capacity_streams)


async def test_follow_applies_the_limit_and_a_rise_grants_a_waiting_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(capacity, "TICK_S", 0.01)
    gate = AdmissionGate(SlotQueue(5, queue_length=4, deadline_s=30), RecordingMetrics())
    granted: list[Ticket] = []
    reports: list[tuple[float, int]] = []
    policy = CapacityPolicy(min_samples=4, window=8, rise_every_s=0.02, hold_s=0.02, rise_step=1)
    controller = DoorController(1.0, policy)
    task = asyncio.create_task(
        capacity.follow(
            gate,
            lambda: slack(1.0, 1.0),
            lambda: gate.active,
            controller,
            lambda door, speaking: reports.append((door.capacity, speaking)),
        )
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
        assert second.state == "granted" and gate.limit >= 2
        assert reports and reports[-1][1] >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
