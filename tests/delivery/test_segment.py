"""The delivery pipeline (gateway.delivery.segment) on the real synthetic
engine's jobs, with no server: resampled audio, failures classified once,
the job stopped when the sink stops reading."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from gateway.audio.resample import StreamResampler
from gateway.delivery.segment import INTERNAL_MESSAGE, Audio, SegmentAudio, segment_job
from gateway.delivery.silence import SilentJob
from gateway.engines.base import (
    EngineEvent,
    SegmentRequest,
    StreamRequest,
    SynthesisError,
    SynthesisJob,
    WordTimings,
)
from gateway.engines.synthetic import SAMPLE_RATE, SyntheticEngine
from gateway.errors import ErrorCode
from gateway.text.frontend import SpokenSegment
from tests.conftest import test_settings as make_settings


def _job(text: str = "A sentence long enough for a few chunks of tone.") -> SynthesisJob:
    engine = SyntheticEngine(make_settings(engine="synthetic"))
    stream = engine.open_stream(StreamRequest(voice="tone", alignment=True))
    return stream.submit(SegmentRequest(text=text))


class _Failing(SynthesisJob):
    """A real job whose events end with ``exc`` after its first chunk."""

    def __init__(self, exc: Exception) -> None:
        self.inner = _job()
        self.stats = self.inner.stats
        self.exc = exc
        self.cancelled = False

    async def _events(self) -> AsyncIterator[EngineEvent]:
        async for event in self.inner:
            yield event
            if not isinstance(event, WordTimings):
                raise self.exc

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._events()

    def cancel(self) -> None:
        self.cancelled = True
        self.inner.cancel()


async def _read(segment: SegmentAudio) -> list[WordTimings | Audio]:
    async with contextlib.aclosing(segment.events()) as events:
        return [event async for event in events]


async def test_audio_comes_out_at_the_output_rate() -> None:
    job = _job()
    resampler = StreamResampler(SAMPLE_RATE, 48_000)
    events = await _read(SegmentAudio(job, resampler))
    assert isinstance(events[0], WordTimings)
    audio = [e for e in events if isinstance(e, Audio)]
    native = sum(a.native_samples for a in audio)
    assert native == job.stats.audio_samples > 0
    out = sum(a.samples.size for a in audio) + resampler.flush().size
    assert abs(out - native * 48_000 / SAMPLE_RATE) <= 2


@pytest.mark.parametrize(
    ("exc", "code", "message"),
    [
        (
            SynthesisError("cannot read it", refused=True),
            ErrorCode.ENGINE_REFUSED,
            "cannot read it",
        ),
        (SynthesisError("synthesis failed: boom"), ErrorCode.INTERNAL, "synthesis failed: boom"),
        (KeyError("a secret internal detail"), ErrorCode.INTERNAL, INTERNAL_MESSAGE),
    ],
)
async def test_a_failure_is_classified_and_the_job_cancelled(
    exc: Exception, code: ErrorCode, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    job = _Failing(exc)
    segment = SegmentAudio(job, StreamResampler(SAMPLE_RATE, SAMPLE_RATE), where="test")
    with caplog.at_level(logging.WARNING, logger="gateway.delivery.segment"):
        events = await _read(segment)  # never raises
    assert sum(isinstance(e, Audio) for e in events) == 1  # the audio before it
    assert segment.failure is not None
    assert segment.failure.code is code and segment.failure.message == message
    assert job.cancelled and not segment.complete
    [record] = caplog.records
    bug = not isinstance(exc, SynthesisError)
    assert (record.exc_info is not None) is bug  # a bug's traceback is logged


async def test_a_sink_that_stops_reading_cancels_the_job() -> None:
    job = _Failing(RuntimeError("never reached"))
    segment = SegmentAudio(job, StreamResampler(SAMPLE_RATE, SAMPLE_RATE))
    async with contextlib.aclosing(segment.events()) as events:
        async for event in events:
            assert isinstance(event, WordTimings)
            break
    assert job.cancelled and segment.failure is None


async def test_a_broken_sink_is_internal_without_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = _Failing(RuntimeError("never reached"))
    segment = SegmentAudio(job, StreamResampler(SAMPLE_RATE, SAMPLE_RATE), where="test")
    try:
        raise ValueError("the sink's secret")
    except ValueError:
        error = segment.broke()
    assert error.code is ErrorCode.INTERNAL and "secret" not in error.message
    assert job.cancelled and segment.failure is error
    assert caplog.records[-1].exc_info is not None


async def test_a_segment_with_nothing_to_speak_calls_no_engine() -> None:
    """``segment_job``, the one way both surfaces make a segment's job."""
    engine = SyntheticEngine(make_settings(engine="synthetic"))
    stream = engine.open_stream(StreamRequest(voice="tone"))
    asked: list[SegmentRequest] = []

    def submit(request: SegmentRequest) -> SynthesisJob:
        asked.append(request)
        return stream.submit(request)

    silent = segment_job(" \n", 5.0, submit)
    assert isinstance(silent, SilentJob) and asked == []
    spoken = segment_job("Say this.", 7.0, submit)
    assert [(r.text, r.deadline) for r in asked] == [("Say this.", 7.0)]
    assert [e async for e in silent] == []
    assert any(not isinstance(e, WordTimings) for e in [e async for e in spoken])
    stream.close()


@pytest.mark.parametrize(
    ("pauses", "text", "before_ms", "after_ms"),
    [
        (((0, 200), (5, 300), (12, 100)), "Hello there.", 200, 400),
        (((0, 1000),), "", 1000, 0),  # a <break> alone: all before
        ((), "Hello.", 0, 0),
    ],
)
def test_the_pauses_are_silence_at_the_output_rate(
    pauses: tuple[tuple[int, int], ...], text: str, before_ms: int, after_ms: int
) -> None:
    spoken = SpokenSegment("source", text, (), pauses=pauses)
    segment = SegmentAudio(SilentJob(), StreamResampler(16000, 16000), spoken=spoken)
    before, after = segment.pause_before(), segment.pause_after()
    assert (before.size, after.size) == (before_ms * 16, after_ms * 16)
    assert not before.any() and not after.any()
    assert SegmentAudio(SilentJob(), StreamResampler(16000, 16000)).pause_before().size == 0
