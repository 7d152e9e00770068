"""The session buffer's rule: the job being sent always progresses, a
prefetched job never takes the session past its bound."""

from __future__ import annotations

from gateway.flow.budget import DecodeBudget


class Wakes:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_an_empty_budget_gives_any_job_one_chunk() -> None:
    budget = DecodeBudget(0.3)
    first, second, wake = object(), object(), Wakes()
    assert budget.reserve(first, 0.5, wake)  # a chunk longer than the bound
    assert not budget.reserve(second, 0.1, wake)  # prefetched: no room
    assert not budget.reserve(first, 0.1, wake)  # holds a chunk: waits
    assert budget.used_s == 0.5


def test_a_prefetched_job_holding_nothing_waits_for_room() -> None:
    """Two jobs submitted together, nothing sent: one chunk past the bound,
    not one per job (the contract suite's 'budget plus one chunk')."""
    budget = DecodeBudget(0.3)
    head, prefetched, wake = object(), object(), Wakes()
    assert budget.reserve(head, 0.31, wake)
    assert not budget.reserve(prefetched, 0.31, wake)
    assert budget.used_s <= budget.limit_s + 0.31
    budget.release(head, 0.31)  # sent: room again, the waiters are woken
    assert wake.count == 1  # the prefetched job's wake
    assert budget.reserve(prefetched, 0.31, wake)


def test_the_job_being_sent_progresses_past_a_full_budget() -> None:
    """The prefetched job filled the buffer; the job being sent holds
    nothing: it takes one chunk (a session never deadlocks on its own
    prefetch), then waits like any other."""
    budget = DecodeBudget(0.3)
    head, prefetched, wake = object(), object(), Wakes()
    assert budget.reserve(prefetched, 0.1, wake)
    assert budget.reserve(prefetched, 0.15, wake)
    assert not budget.reserve(head, 0.2, wake)  # not marked yet
    budget.sending(head)
    assert wake.count == 1  # marking wakes the waiting jobs
    assert budget.reserve(head, 0.2, wake)
    assert not budget.reserve(head, 0.2, wake)  # holds a chunk now
    assert abs(budget.used_s - 0.45) < 1e-9


def test_releasing_a_whole_job_ends_its_mark() -> None:
    budget = DecodeBudget(0.3)
    head, other, wake = object(), object(), Wakes()
    assert budget.reserve(other, 0.3, wake)
    budget.sending(head)
    budget.release(head)  # the job ended
    assert not budget.reserve(head, 0.1, wake)  # no longer exempt
    budget.release(other)
    assert budget.used_s == 0
    assert budget.reserve(head, 0.1, wake)
