"""The engine contract, run over every registered engine (built-in and those
installed through the ``voice_gateway.engines`` entry-point group).

An engine gets these tests by registering.  What the suite needs from it
beyond the interface, the engine supplies (``gateway.engines.contract``):
a ``ContractHooks`` naming which of its model calls to break for a marked
segment, the settings it needs to start, or the other suite its contract
runs from; a third-party engine registers its hooks under the entry-point
group ``voice_gateway.engine_tests`` (``tests/engine/test_plugin_engine.py``
shows one that passes here without an edit to this file).  Engines are
real: the failure is injected by patching the engine's own model call for
one segment, never by a fake engine.

An engine that needs a server this suite cannot start (``external`` in its
hooks: orpheus needs a real vLLM) runs the same tests from its own suite: a
test module there imports them (``from tests.engine.test_contract import
*``) and defines its own ``engine`` fixture yielding the started engine,
which replaces the one below (``tests_vllm/`` does this for orpheus).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from gateway.engines.base import (
    AudioChunk,
    Capabilities,
    Engine,
    EngineEvent,
    EngineStream,
    SegmentRequest,
    StreamRequest,
    SynthesisError,
    SynthesisJob,
    WordTimings,
)
from gateway.engines.contract import contract_hooks
from gateway.engines.delivery import MAX_UNDELIVERED
from gateway.engines.registry import create_engine, registered_engines
from gateway.flow.budget import DecodeBudget
from tests import conftest

SENTENCE = "The quick brown fox jumped over the lazy dog while the curious cat watched quietly."
MEDIUM = "A gentle breeze moved the tall grass by the river."
LONG = " ".join([SENTENCE] * 3)
MARKER = "Xylofailo"

#: built-in engines the gateway's own test fixtures (``tests/conftest.py``)
#: already start for other tests: the suite reuses them (the upstream's needs
#: a replica process); any other engine is started here from its hooks' settings
SHARED_FIXTURES = {
    "piper": "piper_engine",
    "synthetic": "synthetic_engine",
    "upstream": "upstream_engine",
}


def _runs_here(name: str) -> bool:
    hooks = contract_hooks(name)
    return hooks is None or not hooks.external


@pytest.fixture(params=sorted(n for n in registered_engines() if _runs_here(n)))
def engine(request: pytest.FixtureRequest) -> Engine:
    name: str = request.param
    fixture = SHARED_FIXTURES.get(name, "registered_engine")
    started: Engine = request.getfixturevalue(fixture)
    return started


@pytest_asyncio.fixture(loop_scope="function")
async def registered_engine(request: pytest.FixtureRequest) -> AsyncIterator[Engine]:
    """An engine started in the test's own event loop, with the settings its
    hooks ask for, and closed after the test."""
    name: str = request.node.callspec.params["engine"]
    hooks = contract_hooks(name)
    settings = conftest.test_settings(engine=name, **(hooks.settings if hooks else {}))
    started = create_engine(settings)
    await started.start()
    try:
        yield started
    finally:
        await started.aclose()


class Reader:
    """Consumes a job in a task of its own, like the speaker does."""

    def __init__(self, job: SynthesisJob) -> None:
        self.job = job
        self.events: list[EngineEvent] = []
        self.error: SynthesisError | None = None
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for event in self.job:
                self.events.append(event)
        except SynthesisError as exc:
            self.error = exc

    @property
    def chunks(self) -> list[np.ndarray]:
        return [e.samples for e in self.events if isinstance(e, AudioChunk)]

    def samples(self) -> int:
        return sum(c.size for c in self.chunks)


async def read_all(job: SynthesisJob, limit_s: float = 60) -> Reader:
    reader = Reader(job)
    await asyncio.wait_for(reader.task, limit_s)
    return reader


async def until_moved(read: Callable[[], int], limit_s: float) -> None:
    """Wait until ``read()`` leaves its first value: the engine started
    producing (a remote model's first chunk may take longer than a quiet
    period, and ``until_stable`` would then settle on nothing)."""
    deadline = time.monotonic() + limit_s
    first = read()
    while read() == first:
        if time.monotonic() > deadline:
            raise AssertionError("the engine produced nothing")
        await asyncio.sleep(0.02)


async def until_stable(read: Callable[[], int], quiet_s: float, limit_s: float) -> int:
    """Wait until ``read()`` has not changed for ``quiet_s``."""
    deadline = time.monotonic() + limit_s
    value, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return value
    raise AssertionError("the engine never settled")


def open_stream(engine: Engine, **options: Any) -> EngineStream:
    return engine.open_stream(
        StreamRequest(engine.default_voice().name, label="contract", **options)
    )


def rate_of(engine: Engine) -> int:
    return engine.default_voice().sample_rate


# --- capabilities -----------------------------------------------------------------


def test_capabilities_are_declared_once_and_cover_the_voices(engine: Engine) -> None:
    caps = engine.capabilities
    assert isinstance(caps, Capabilities)
    assert caps.sample_rates and all(r > 0 for r in caps.sample_rates)
    assert {v.sample_rate for v in engine.voices()} <= set(caps.sample_rates)
    assert {v.language for v in engine.voices()} <= set(caps.languages)
    assert caps.input in ("segments", "text_stream")
    assert caps.max_concurrency >= 0 and 0 < caps.typical_first_chunk_s < 10


async def test_chunks_are_at_the_native_rate_and_alignment_as_declared(engine: Engine) -> None:
    caps = engine.capabilities
    stream = open_stream(engine, alignment=True)
    reader = await read_all(stream.submit(SegmentRequest(SENTENCE)))
    assert reader.error is None and reader.chunks
    assert all(c.dtype == np.float32 and c.ndim == 1 for c in reader.chunks)
    assert all(float(np.max(np.abs(c), initial=0.0)) <= 1.0 for c in reader.chunks)
    seconds = reader.samples() / rate_of(engine)
    assert reader.job.stats.audio_samples == reader.samples()
    if reader.job.stats.audio_seconds is not None:  # the engine's own length, at its rate
        assert abs(reader.job.stats.audio_seconds - seconds) < 0.05
    timings = [e for e in reader.events if isinstance(e, WordTimings)]
    if caps.alignment:
        assert len(timings) == 1 and timings[0].words
        last = timings[0].words[-1]
        assert last.end_ms <= seconds * 1000 + 50  # inside the audio at the native rate
    else:
        assert timings == []  # asked for, not declared: none


# --- word timings never follow their audio ---------------------------------------------


@pytest.mark.parametrize("alignment", [True, False])
async def test_word_timings_come_before_the_audio_they_describe(
    engine: Engine, alignment: bool
) -> None:
    stream = open_stream(engine, alignment=alignment)
    jobs = [stream.submit(SegmentRequest(text)) for text in (MEDIUM, SENTENCE, "Yes.")]
    for job in jobs:
        reader = await read_all(job)
        assert reader.error is None and reader.chunks
        kinds = [type(e) for e in reader.events]
        expected = alignment and engine.capabilities.alignment
        assert kinds.count(WordTimings) == (1 if expected else 0)
        if expected:
            assert kinds[0] is WordTimings  # before any audio of its segment
            words = reader.events[0]
            assert isinstance(words, WordTimings)
            starts = [w.start_ms for w in words.words]
            assert starts == sorted(starts)


# --- the session's budget -------------------------------------------------------------


async def test_budget_bounds_decoded_unsent_audio(engine: Engine) -> None:
    """The consumer takes every chunk but sends none (never releases): the
    engine stops at the budget plus one chunk; sending resumes it."""
    budget = DecodeBudget(0.3)
    stream = open_stream(engine, budget=budget)
    readers = [Reader(stream.submit(SegmentRequest(t))) for t in (LONG, SENTENCE)]
    rate = rate_of(engine)
    await until_moved(lambda: sum(r.samples() for r in readers), 60)
    await until_stable(lambda: sum(r.samples() for r in readers), 1.0, 60)
    largest = max(c.size for r in readers for c in r.chunks) / rate
    decoded = sum(r.job.stats.audio_samples for r in readers) / rate
    assert decoded <= budget.limit_s + largest + 1e-6, (decoded, largest)
    assert budget.used_s <= budget.limit_s + largest + 1e-6
    assert not readers[0].task.done()  # held by the budget, not finished
    # "send" everything from now on: the utterance completes in order
    async with asyncio.timeout(120):
        while not all(r.task.done() for r in readers):
            for r in readers:
                budget.release(r.job)
            await asyncio.sleep(0.02)
    assert all(r.error is None for r in readers)
    assert readers[0].samples() / rate > 5 * (budget.limit_s + largest)
    for r in readers:
        budget.release(r.job)
    assert budget.used_s == 0


async def test_an_unread_job_holds_a_bounded_number_of_chunks(engine: Engine) -> None:
    stream = open_stream(engine)
    job = stream.submit(SegmentRequest(LONG))
    await until_moved(lambda: job.stats.chunks, 60)
    await until_stable(lambda: job.stats.chunks, 1.0, 60)
    assert 1 <= job.stats.chunks <= MAX_UNDELIVERED
    job.cancel()


# --- cancel --------------------------------------------------------------------------


async def test_cancel_stops_output_within_a_chunk(engine: Engine) -> None:
    budget = DecodeBudget(60)
    stream = open_stream(engine, budget=budget)
    job = stream.submit(SegmentRequest(LONG))
    queued = stream.submit(SegmentRequest(LONG))
    events = job.__aiter__()
    while not isinstance(await anext(events), AudioChunk):
        pass
    at_cancel = (job.stats.chunks, queued.stats.chunks)
    stream.cancel()  # the whole utterance
    stream.cancel()  # idempotent
    after = [event async for event in events]  # ends quietly
    assert len(after) <= MAX_UNDELIVERED  # at most what was already delivered
    await asyncio.sleep(0.5)
    assert job.stats.chunks - at_cancel[0] <= 1  # the chunk in flight, no more
    assert queued.stats.chunks - at_cancel[1] <= 1
    assert job.stats.cancelled and queued.stats.cancelled
    leftover = [e async for e in queued]  # what it had delivered before the cancel
    assert sum(isinstance(e, AudioChunk) for e in leftover) <= MAX_UNDELIVERED
    assert budget.used_s == 0  # cancelled reservations are released
    late = stream.submit(SegmentRequest(MEDIUM))  # after a cancel: ends at once
    assert [e async for e in late] == []
    await until_stable(engine.live_jobs, 0.2, 10)
    assert engine.live_jobs() == 0


async def test_cancel_of_one_segment_leaves_the_next(engine: Engine) -> None:
    stream = open_stream(engine)
    first = stream.submit(SegmentRequest(LONG))
    second = stream.submit(SegmentRequest(MEDIUM))
    first.cancel()
    first.cancel()  # idempotent
    leftover = [e async for e in first]
    assert first.stats.cancelled and sum(isinstance(e, AudioChunk) for e in leftover) <= 1
    reader = await read_all(second)
    assert reader.error is None and reader.samples() > 0


# --- failures ----------------------------------------------------------------------


async def test_submit_never_raises_and_an_unknown_voice_fails_its_segment(
    engine: Engine,
) -> None:
    stream = engine.open_stream(StreamRequest("no-such-voice-anywhere"))
    job = stream.submit(SegmentRequest(MEDIUM))
    with pytest.raises(SynthesisError):
        async for _ in job:
            pass


async def test_a_failing_segment_fails_alone(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks = contract_hooks(engine.name)
    assert hooks is not None and hooks.fail_segment is not None, (
        f"engine {engine.name!r} supplies no failure hook: register a ContractHooks under"
        " the voice_gateway.engine_tests entry-point group (docs/engine.md)"
    )
    hooks.fail_segment(monkeypatch.setattr, MARKER)
    stream = open_stream(engine, alignment=True)
    jobs = [
        stream.submit(SegmentRequest(text))
        for text in (MEDIUM, f"{MARKER} went wrong with this sentence, said the tester.", MEDIUM)
    ]
    readers = [await read_all(job) for job in jobs]
    assert readers[0].error is None and readers[0].samples() > 0
    assert readers[1].error is not None  # raised from its own iteration
    assert readers[2].error is None and readers[2].samples() == readers[0].samples()
    await until_stable(engine.live_jobs, 0.2, 10)
    assert engine.live_jobs() == 0
