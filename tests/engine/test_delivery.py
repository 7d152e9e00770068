"""The shared delivery machinery on its own: a worker thread producing into a
``DeliveredJob`` the way an engine does, without any model."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from gateway.engines.base import (
    AudioChunk,
    SegmentRequest,
    StreamRequest,
    SynthesisError,
    WordTiming,
    WordTimings,
)
from gateway.engines.delivery import MAX_UNDELIVERED, DeliveredJob, DeliveryStream, LiveJobs
from gateway.flow.budget import DecodeBudget

TIMINGS = WordTimings((WordTiming("hi", 0.0, 100.0),))


def make_job(**options: object) -> DeliveredJob:
    request = StreamRequest("v", **options)  # type: ignore[arg-type]
    return DeliveredJob(SegmentRequest("hi"), request, 0, asyncio.get_running_loop())


def chunk(n: int = 100) -> np.ndarray:
    return np.zeros(n, np.float32)


async def test_first_chunk_waits_for_the_word_timings() -> None:
    job = make_job(alignment=True)
    produced = threading.Event()

    def worker() -> None:
        job.chunk(chunk())  # decoded before the timings were worked out
        produced.set()

    thread = threading.Thread(target=worker)
    thread.start()
    await asyncio.sleep(0.2)
    assert not produced.is_set()  # held until the timings are delivered
    job.timings(TIMINGS)
    await asyncio.to_thread(thread.join, 5)
    job.finish()
    events = [e async for e in job]
    assert isinstance(events[0], WordTimings) and isinstance(events[1], AudioChunk)


async def test_no_timings_without_alignment() -> None:
    job = make_job(alignment=False)
    job.timings(TIMINGS)
    assert job.chunk(chunk())
    job.finish()
    assert [type(e) for e in [e async for e in job]] == [AudioChunk]


async def test_bound_refuses_then_wakes_when_the_consumer_takes_a_chunk() -> None:
    job = make_job()
    woken = threading.Event()
    for _ in range(MAX_UNDELIVERED):
        assert job.acquire(0.1, woken.set)
        assert job.chunk(chunk())
    assert not job.acquire(0.1, woken.set)
    events = job.__aiter__()
    await anext(events)
    assert woken.is_set()
    assert job.acquire(0.1, woken.set)
    job.cancel()


async def test_budget_reservation_is_released_on_cancel_and_failure() -> None:
    budget = DecodeBudget(1.0)
    job = make_job(budget=budget)
    assert job.acquire(0.6, lambda: None)
    assert job.acquire(0.3, lambda: None)
    assert not job.acquire(0.3, lambda: None)  # 1.2 > 1.0: full
    job.cancel()
    assert budget.used_s == 0
    assert not job.acquire(0.1, lambda: None)  # a cancelled job never produces
    failed = make_job(budget=budget)
    assert failed.acquire(0.5, lambda: None)
    failed.fail("model error")
    assert budget.used_s == 0
    with pytest.raises(SynthesisError, match="model error"):
        async for _ in failed:
            pass


async def test_cancel_is_idempotent_thread_safe_and_runs_hooks_once() -> None:
    job = make_job()
    calls: list[str] = []
    job.on_cancel(lambda: calls.append("terminate"))
    threads = [threading.Thread(target=job.cancel) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["terminate"] and job.stats.cancelled
    job.on_cancel(lambda: calls.append("late"))  # registered after: runs at once
    assert calls == ["terminate", "late"]
    assert not job.started() and not job.chunk(chunk())
    assert job.stats.chunks == 1  # produced, dropped, counted
    assert [e async for e in job] == []


async def test_leaving_the_iteration_early_cancels() -> None:
    job = make_job()
    for _ in range(2):
        job.chunk(chunk())
    events = job.__aiter__()
    await anext(events)
    await events.aclose()  # type: ignore[attr-defined]  # what the speaker does
    assert job.cancelled


async def test_stream_turns_a_start_failure_into_the_segment_error() -> None:
    live = LiveJobs()

    class Broken(DeliveryStream):
        def start(self, job: DeliveredJob) -> None:
            if "bad" in job.text:
                raise ValueError("internal detail /path/x")
            job.started()
            job.chunk(chunk())
            job.finish()

    stream = Broken(StreamRequest("v"), live)
    bad = stream.submit(SegmentRequest("bad"))  # never raises
    good = stream.submit(SegmentRequest("good"))
    with pytest.raises(SynthesisError) as info:
        async for _ in bad:
            pass
    assert "/path" not in str(info.value)  # no internal detail leaks
    assert [type(e) for e in [e async for e in good]] == [AudioChunk]
    assert good.index == 1 and not good.first_in_utterance and bad.first_in_utterance
    assert len(live) == 0
