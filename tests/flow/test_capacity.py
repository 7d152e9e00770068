"""Automatic admission's door (gateway.flow.capacity), without a server: the
pure controller table-tested with the clock passed in (the reservation of
measured compute, the slack's safety cut, the speaking share), the cost
meter, the start's seed, and the loop that applies the limit to a real
``AdmissionGate``."""

from __future__ import annotations

import asyncio

import pytest

from gateway.flow import capacity
from gateway.flow.admission import AdmissionGate, SlotQueue, Ticket
from gateway.flow.capacity import (
    CapacityPolicy,
    CostMeter,
    DoorController,
    Lateness,
    StageCost,
    seed_capacity,
)
from tests.flow.test_admission import RecordingMetrics

#: two cores, half reserved: a budget of one core
POLICY = CapacityPolicy(
    floor=1,
    ceiling=40,
    cores=2,
    cpu_share=0.5,
    cost_sample_audio_s=1.0,
    cost_average_audio_s=4.0,
    tight_s=0.1,
    ample_s=0.3,
    window=20,
    min_samples=10,
    cut_factor=0.8,
    cut_keeps=0.5,
    hold_s=2.0,
    rise_every_s=1.0,
    trim_step=0.1,
    prior_share=1.0,
    min_share=0.25,
    share_average_s=10.0,
    speaking_average_s=1.0,
    max_overcommit=1.5,
)


def work(
    acoustic: float, decode: float, audio_s: float = 2.0, slack: tuple[float, ...] = ()
) -> Lateness:
    """A reading: each stage's CPU seconds for ``audio_s`` of audio made."""
    return Lateness(
        finished=len(slack),
        slack_s=slack,
        stages=(StageCost(acoustic * audio_s, audio_s), StageCost(decode * audio_s, audio_s)),
        audio_s=audio_s,
    )


def slack(*values: float) -> Lateness:
    return Lateness(finished=len(values), slack_s=values)


AMPLE = slack(*[0.5] * 10)
TIGHT = slack(*[0.02] * 10)
#: one late item among ten: the 10th percentile is the second lowest
ONE_LATE = slack(-0.4, *[0.5] * 9)
#: 0.04 + 0.05 CPU seconds per audio second in the stages, 0.01 in the loop:
#: 0.1 in all, so the budget (one core) pays for 10 streams
COST_01 = work(0.04, 0.05)
LOOP_01 = 0.01 * 2.0


def measured(start: float = 4.0, policy: CapacityPolicy = POLICY) -> DoorController:
    """A controller that has measured a cost of 0.1 (capacity 10 streams)."""
    controller = DoorController(start, policy)
    controller.update(0.0, COST_01, 0, 0, 0, LOOP_01)
    assert controller.cost == pytest.approx(0.1)
    return controller


def test_until_the_cost_is_measured_the_door_admits_the_seed() -> None:
    controller = DoorController(4.0, POLICY)
    assert (controller.cost, controller.capacity, controller.limit) == (None, 4.0, 4)
    # the stages measured, the event loop not yet (nothing spoken beside it)
    controller.update(0.0, work(0.04, 0.05, audio_s=0.0), 2, 2, 3, 0.0)
    assert controller.cost is None and controller.limit == 4
    # too little audio for a sample: still the seed
    controller.update(0.25, work(0.04, 0.05, audio_s=0.5), 2, 2, 3, 0.005)
    assert controller.cost is None and controller.limit == 4


def test_the_door_reserves_the_budget_at_the_measured_cost() -> None:
    """Capacity is the reserved cores over the cost: one core at 0.1 CPU
    seconds per audio second is ten streams."""
    controller = measured()
    assert controller.budget_cores == 1.0
    assert controller.capacity == pytest.approx(10.0) and controller.limit == 10


def test_samples_below_the_minimum_audio_add_up() -> None:
    controller = DoorController(4.0, POLICY)
    for i in range(4):  # four quarter-second readings of a quarter second each
        controller.update(i * 0.25, work(0.04, 0.05, audio_s=0.25), 1, 1, 0, 0.0025)
    assert controller.cost == pytest.approx(0.1)


def test_the_cost_follows_a_change_as_an_average_over_audio() -> None:
    """A dearer sample moves the cost by its audio's weight (2 s of 4 s):
    halfway, not all the way, and the door with it."""
    controller = measured()
    controller.update(0.25, work(0.08, 0.10), 6, 6, 0, 0.04)  # twice the cost
    assert controller.cost == pytest.approx(0.15)
    assert controller.capacity == pytest.approx(1.0 / 0.15)
    controller.update(0.5, work(0.08, 0.10), 6, 6, 0, 0.04)
    assert controller.cost == pytest.approx(0.175)


@pytest.mark.parametrize(
    "readings",
    [
        pytest.param([AMPLE] * 12, id="ample slack"),
        pytest.param([ONE_LATE] * 12, id="one late item among many"),
        pytest.param([slack(*[0.2] * 10)] * 12, id="slack between the thresholds"),
    ],
)
def test_no_slack_however_ample_opens_the_door_past_the_reservation(
    readings: list[Lateness],
) -> None:
    """The round-12 failure: a controller that rose on ample slack admitted
    a burst of sessions past what the machine carries.  The reservation is
    the ceiling: waiting sessions and ample slack do not move it."""
    controller = measured()
    for i, reading in enumerate(readings):
        assert controller.update(1.0 + i, reading, 10, 10, 30) == 10


# each step: (time, reading, admitted, speaking, waiting, the limit after it)
Step = tuple[float, Lateness, int, int, int, int]


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(
            [(1.0, TIGHT, 10, 10, 0, 8), (1.5, TIGHT, 10, 10, 0, 8), (3.0, TIGHT, 10, 10, 0, 6)],
            id="tight slack cuts to a share of the streams speaking, at most once per hold",
        ),
        pytest.param(
            [(1.0, TIGHT, 10, 10, 0, 8), (2.0, AMPLE, 10, 10, 0, 8), (3.0, AMPLE, 10, 10, 0, 9)],
            id="ample slack brings a cut back by a step of the reservation, after the hold",
        ),
        pytest.param(
            [
                (1.0, TIGHT, 10, 10, 0, 8),
                (3.0, AMPLE, 10, 10, 0, 9),
                (3.5, AMPLE, 10, 10, 0, 9),  # within rise_every_s of the last step
                (4.0, AMPLE, 10, 10, 0, 10),
                (5.0, AMPLE, 10, 10, 0, 10),  # never past the reservation
                (6.0, AMPLE, 10, 10, 0, 10),
            ],
            id="a step at most every rise_every_s, each on fresh evidence, up to the reservation",
        ),
        pytest.param(
            [(1.0, slack(0.02, 0.02, 0.02), 10, 10, 0, 10)],
            id="no decision on too few samples",
        ),
        pytest.param(
            [(1.0, TIGHT, 0, 0, 0, 10), (4.0, TIGHT, 0, 0, 0, 10)],
            id="no cut while nobody speaks (the late work was of sessions gone)",
        ),
        pytest.param(
            [(1.0, TIGHT, 1, 1, 0, 5), (2.0, TIGHT, 1, 1, 0, 5), (3.0, TIGHT, 1, 1, 0, 2)],
            id="few speaking: a cut keeps cut_keeps of the capacity; a lasting load is cut again",
        ),
        pytest.param(
            [(1.0 + 2 * i, TIGHT, 1, 1, 0, n) for i, n in enumerate([5, 2, 1, 1])],
            id="never below the floor",
        ),
    ],
)
def test_the_slack_is_a_safety_cut_under_the_reservation(steps: list[Step]) -> None:
    controller = measured()
    for now, reading, admitted, speaking, waiting, expected in steps:
        got = controller.update(now, reading, admitted, speaking, waiting)
        assert got == expected, (now, controller.capacity, controller.trim, controller.slack_p10)


def test_the_reservation_keeps_a_cut_as_the_cost_changes() -> None:
    """The cut is a share of the reservation: when the cost halves, so does
    what the cut leaves, in streams, double."""
    controller = measured()
    controller.update(1.0, TIGHT, 10, 8, 0)  # 0.8 x 8 = 6.4 of 10 streams: trim 0.64
    assert controller.trim == pytest.approx(0.64)
    for i in range(8):  # the cost falls towards 0.05
        controller.update(1.5 + i * 0.1, work(0.02, 0.025), 10, 8, 0, 0.01)
    assert controller.cost is not None
    assert controller.capacity == pytest.approx(0.64 / controller.cost, rel=1e-6)


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
    controller = measured()
    for i in range(100):
        assert controller.update(1.0 + i * 0.25, Lateness(), 0, 0, 0, 0.001) == 10
    assert controller.cost == pytest.approx(0.1)  # the loop idling is not audio's cost


def test_the_ceiling_holds_however_cheap_the_audio() -> None:
    controller = DoorController(4.0, POLICY)
    controller.update(0.0, work(0.0001, 0.0001), 0, 0, 0, 0.0)
    assert controller.capacity == 40.0 and controller.limit == 40


def test_the_meter_averages_each_part_over_its_own_audio() -> None:
    meter = CostMeter(sample_audio_s=1.0, average_audio_s=2.0)
    meter.add("decode", 0.1, 1.0)
    assert meter.per_audio_s(2) is None  # one part of two
    meter.add("loop", 0.02, 1.0)
    assert meter.per_audio_s(2) == pytest.approx(0.12)
    meter.add("decode", 0.3, 1.0)  # 0.3 per second, weighted by half
    assert meter.parts["decode"] == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("streams", "capacity_streams"),
    [(0.0, 1.0), (1.0, 1.0), (7.4, 3.7), (12.4, 6.2)],
)
def test_the_start_assumes_half_the_measured_real_time_streams(
    streams: float, capacity_streams: float
) -> None:
    assert seed_capacity(streams, POLICY) == pytest.approx(capacity_streams)


async def test_follow_applies_the_limit_and_a_measured_cost_grants_a_waiting_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(capacity, "TICK_S", 0.01)
    gate = AdmissionGate(SlotQueue(5, queue_length=4, deadline_s=30), RecordingMetrics())
    granted: list[Ticket] = []
    reports: list[tuple[float, int]] = []
    policy = CapacityPolicy(cores=1, cpu_share=0.5, cost_sample_audio_s=0.5)
    controller = DoorController(1.0, policy)
    task = asyncio.create_task(
        capacity.follow(
            gate,
            # cheap audio (the event loop's CPU is this test's own, about nothing)
            lambda: work(0.01, 0.01, audio_s=1.0),
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
        assert controller.cost is not None and reports and reports[-1][1] >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
