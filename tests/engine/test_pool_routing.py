"""The replica pool's state machine, table-driven (no I/O, explicit clock)."""

from __future__ import annotations

import pytest

from gateway.engines.pool.routing import (
    Outcome,
    Pool,
    PoolPolicy,
    ReplicaState,
    classify_status,
)

NAMES = ["http://a:8000", "http://b:8000", "http://c:8000"]


def pool(probing: bool = False, cap: int = 2, threshold: int = 3, cooldown: float = 5.0) -> Pool:
    return Pool(NAMES, PoolPolicy(threshold, cooldown, cap, probing))


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.OK),
        (400, Outcome.CLIENT_ERROR),
        (401, Outcome.CLIENT_ERROR),
        (404, Outcome.CLIENT_ERROR),
        (422, Outcome.CLIENT_ERROR),
        (408, Outcome.FAILURE),
        (429, Outcome.FULL),
        (500, Outcome.FAILURE),
        (502, Outcome.FAILURE),
        (503, Outcome.FULL),
        (504, Outcome.FAILURE),
        (302, Outcome.FAILURE),
    ],
)
def test_status_classes(status: int, outcome: Outcome) -> None:
    assert classify_status(status) is outcome


def test_least_outstanding_with_round_robin_ties() -> None:
    p = pool(cap=10)
    picks = []
    for _ in range(3):
        i = p.pick(0.0)
        assert i is not None
        picks.append(i)
    assert sorted(picks) == [0, 1, 2]  # ties rotate: each idle replica once
    p.acquire(0)
    p.acquire(0)
    p.acquire(1)
    assert p.pick(0.0) == 2
    p.acquire(2)
    p.acquire(2)
    assert p.pick(0.0) == 1  # a: 2, b: 1, c: 2


def test_cap_counts_every_request_and_waiting() -> None:
    p = pool(cap=1)
    for i in range(3):
        p.acquire(i)
    assert p.pick(0.0) is None
    assert p.waiting_for_room(0.0)
    p.release(1)
    assert p.pick(0.0) == 1


def test_exclude_skips_replicas_already_tried() -> None:
    p = pool()
    assert p.pick(0.0, frozenset({0, 1})) == 2
    assert p.pick(0.0, frozenset({0, 1, 2})) is None
    assert not p.waiting_for_room(0.0, frozenset({0, 1, 2}))


# (outcomes reported on replica 0 at t=0, state after, routable at t=1, at t=6)
@pytest.mark.parametrize(
    ("outcomes", "state", "at_1", "at_6"),
    [
        ([Outcome.FAILURE] * 2, ReplicaState.READY, True, True),
        ([Outcome.FAILURE] * 3, ReplicaState.EJECTED, False, True),
        (
            [Outcome.FAILURE, Outcome.FAILURE, Outcome.OK, Outcome.FAILURE],
            ReplicaState.READY,
            True,
            True,
        ),
        ([Outcome.FULL] * 10, ReplicaState.READY, True, True),
        ([Outcome.CLIENT_ERROR] * 10, ReplicaState.READY, True, True),
        (
            [Outcome.FAILURE, Outcome.FULL, Outcome.FAILURE, Outcome.CLIENT_ERROR, Outcome.FAILURE],
            ReplicaState.EJECTED,
            False,
            True,
        ),
    ],
)
def test_passive_ejection(
    outcomes: list[Outcome], state: ReplicaState, at_1: bool, at_6: bool
) -> None:
    p = pool()
    for outcome in outcomes:
        p.report(0, outcome, 0.0)
    assert p.replicas[0].state is state
    assert p.routable(p.replicas[0], 1.0) is at_1
    assert p.routable(p.replicas[0], 6.0) is at_6


def test_probation_after_cool_down() -> None:
    p = pool()
    for _ in range(3):
        p.report(0, Outcome.FAILURE, 0.0)
    assert p.pick(1.0, frozenset({1, 2})) is None
    assert p.pick(5.0, frozenset({1, 2})) == 0  # cool-down over: tried again
    p.report(0, Outcome.FAILURE, 5.0)  # one more failure on probation: out again
    assert p.replicas[0].state is ReplicaState.EJECTED
    assert p.replicas[0].ejected_until == 10.0
    assert p.replicas[0].ejections == 2
    p.report(0, Outcome.OK, 10.5)  # back
    assert p.replicas[0].state is ReplicaState.READY
    assert p.replicas[0].consecutive_failures == 0


@pytest.mark.parametrize(
    ("steps", "state", "ready"),
    [
        ([], ReplicaState.STARTING, False),
        ([("probe", True)], ReplicaState.READY, True),
        ([("probe", False)], ReplicaState.UNREADY, False),
        ([("probe", True), ("probe", False)], ReplicaState.UNREADY, False),
        ([("probe", False), ("probe", True)], ReplicaState.READY, True),
        # a passing probe does not end an ejection early
        (
            [("probe", True), ("fail", 0), ("fail", 0), ("fail", 0), ("probe", True)],
            ReplicaState.EJECTED,
            False,
        ),
    ],
)
def test_active_probes(steps: list[tuple[str, object]], state: ReplicaState, ready: bool) -> None:
    p = Pool(NAMES[:1], PoolPolicy(probing=True))
    for step, value in steps:
        if step == "probe":
            p.probed(0, bool(value), 1.0)
        else:
            p.report(0, Outcome.FAILURE, 1.0)
    assert p.replicas[0].state is state
    assert p.ready(2.0) is ready


def test_ready_while_one_replica_is() -> None:
    p = Pool(NAMES, PoolPolicy(probing=True))
    assert not p.ready(0.0)
    p.probed(2, True, 0.0)
    assert p.ready(0.0)
    assert p.pick(0.0) == 2
    p.probed(2, False, 1.0)
    assert not p.ready(1.0)


def test_failures_are_counted_by_kind() -> None:
    p = pool()
    p.report(1, Outcome.FULL, 0.0, "busy")
    p.report(1, Outcome.FAILURE, 0.0, "connect")
    p.report(1, Outcome.FAILURE, 0.0, "connect")
    assert p.replicas[1].failures == {"busy": 1, "connect": 2}
