"""GatewayTTSService inside a real Pipecat pipeline, against a real gateway.

No wall-clock thresholds: what happened is read from the frames the
pipeline delivers, the events the gateway sent the service, and the
gateway's own ``/metrics``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transcriptions.language import Language
from pipecat.workers.runner import WorkerRunner
from voice_gateway_wire.testing import DroppingProxy, Gateway

from voice_gateway_pipecat import GatewayTTSService, GatewayTTSSettings

PIPELINE_RATE = 16000
LONG_TEXT = " ".join(
    f"This is sentence number {n} of a long answer that the user will interrupt."
    for n in range(1, 9)
)
#: a guard against a hung test, never an assertion about speed
HANG_GUARD_S = 90


class Recorder(FrameProcessor):
    """Records the frames passing in one direction."""

    def __init__(self, direction: FrameDirection) -> None:
        super().__init__()
        self.direction = direction
        self.frames: list[Frame] = []
        self._changed = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == self.direction:
            self.frames.append(frame)
            self._changed.set()
        await self.push_frame(frame, direction)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(HANG_GUARD_S):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

    def of(self, kind: type[Frame], context_id: str | None = None) -> list[Any]:
        return [
            f
            for f in self.frames
            if isinstance(f, kind)
            and (context_id is None or getattr(f, "context_id", None) == context_id)
        ]


class RecordingService(GatewayTTSService):
    """The service under test, keeping every gateway event it handled."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.events: list[dict[str, Any]] = []
        self._event_seen = asyncio.Event()

    async def _handle_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._event_seen.set()
        await super()._handle_event(event)

    def of(self, kind: str, context_id: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e["type"] == kind and (context_id is None or e.get("context_id") == context_id)
        ]

    async def wait_event(self, kind: str, context_id: str | None = None) -> dict[str, Any]:
        async with asyncio.timeout(HANG_GUARD_S):
            while not self.of(kind, context_id):
                self._event_seen.clear()
                await self._event_seen.wait()
        return self.of(kind, context_id)[-1]


@dataclass
class Harness:
    tts: RecordingService
    down: Recorder
    up: Recorder
    worker: PipelineWorker

    async def send(self, *frames: Frame) -> None:
        for frame in frames:
            await self.worker.queue_frame(frame)


@asynccontextmanager
async def pipeline(gateway: Gateway, **service_args: Any) -> AsyncIterator[Harness]:
    tts = RecordingService(url=gateway.ws_url, **service_args)
    up, down = Recorder(FrameDirection.UPSTREAM), Recorder(FrameDirection.DOWNSTREAM)
    worker = PipelineWorker(
        Pipeline([up, tts, down]),
        params=PipelineParams(audio_out_sample_rate=PIPELINE_RATE),
        cancel_on_idle_timeout=False,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    async with asyncio.timeout(HANG_GUARD_S):
        await started.wait()
    try:
        yield Harness(tts, down, up, worker)
    finally:
        await worker.queue_frame(EndFrame())
        async with asyncio.timeout(HANG_GUARD_S):
            await run


def _context_of_first_audio(down: Recorder) -> str:
    audio = down.of(TTSAudioRawFrame)
    assert audio, "no audio"
    context_id = audio[0].context_id
    assert isinstance(context_id, str)
    return context_id


async def test_llm_turn_speaks_with_word_timestamps(gateway: Gateway) -> None:
    async with pipeline(gateway) as h:
        assert h.tts.server_info["protocol_version"].startswith("2.")
        # the session asked for the pipeline's rate, tagged framing, realtime
        config = h.tts.effective_config
        assert config["sample_rate"] == PIPELINE_RATE and config["framing"] == "tagged"
        assert config["flow_control"] == "realtime" and config["timestamps"] is True
        await h.send(LLMFullResponseStartFrame())
        for token in ["Hello ", "there, ", "how ", "are ", "you ", "today? ", "Fine ", "thanks."]:
            await h.send(LLMTextFrame(token))
        await h.send(LLMFullResponseEndFrame())
        await h.down.wait_for(lambda: bool(h.down.of(TTSStoppedFrame)))
        context_id = _context_of_first_audio(h.down)
        audio = h.down.of(TTSAudioRawFrame)
        assert all(f.context_id == context_id for f in audio)
        assert all(f.sample_rate == PIPELINE_RATE and f.num_channels == 1 for f in audio)
        # the gateway's account of the utterance matches the audio delivered
        done = h.tts.of("session.done", context_id)
        assert len(done) == 1 and not done[0]["cancelled"]
        delivered_ms = sum(len(f.audio) for f in audio) / 2 / PIPELINE_RATE * 1000
        assert delivered_ms == pytest.approx(done[0]["metrics"]["audio_ms"], abs=1.0)
        # word timings became the spoken text, pushed by the service itself
        assert h.tts.of("alignment", context_id)
        words = [f.text.strip() for f in h.down.of(TTSTextFrame)]
        assert "".join(words).replace(" ", "") == "Hellothere,howareyoutoday?Finethanks."
        assert not h.up.of(ErrorFrame)


async def test_interruption_cancels_on_the_gateway_and_a_second_turn_follows(
    gateway: Gateway,
) -> None:
    cancels_before = gateway.metric("gateway_cancels_total")
    async with pipeline(gateway) as h:
        session_id = h.tts.server_info["session_id"]
        await h.send(TTSSpeakFrame(LONG_TEXT))
        await h.down.wait_for(lambda: bool(h.down.of(TTSAudioRawFrame)))
        first = _context_of_first_audio(h.down)
        await h.send(InterruptionFrame())
        await h.down.wait_for(lambda: bool(h.down.of(InterruptionFrame)))
        report = await h.tts.wait_event("audio.cancelled", first)
        await h.tts.wait_event("session.done", first)
        # the gateway cut the utterance: most of the text was never spoken
        assert report["unspoken_text"] and "sentence number 8" in report["unspoken_text"]
        assert h.tts.of("session.done", first)[-1]["cancelled"] is True
        # no audio of the interrupted context reached the pipeline after the
        # interruption did
        cut = next(i for i, f in enumerate(h.down.frames) if isinstance(f, InterruptionFrame))
        late = [
            f
            for f in h.down.frames[cut:]
            if isinstance(f, TTSAudioRawFrame) and f.context_id == first
        ]
        assert late == []
        delivered = sum(len(f.audio) for f in h.down.of(TTSAudioRawFrame, first)) / 2
        assert delivered / PIPELINE_RATE * 1000 <= report["sent_ms"] + 1.0

        # a second turn on the same socket and gateway session
        await h.send(TTSSpeakFrame("And now something else."))
        await h.down.wait_for(
            lambda: any(f.context_id != first for f in h.down.of(TTSStoppedFrame))
        )
        second = next(f.context_id for f in h.down.of(TTSStoppedFrame) if f.context_id != first)
        assert h.down.of(TTSAudioRawFrame, second)
        assert not h.tts.of("session.done", second)[-1]["cancelled"]
        assert h.tts.server_info["session_id"] == session_id
        assert len(h.tts.of("session.updated")) == 0  # no reconnect, no new config
    assert gateway.metric("gateway_cancels_total") == cancels_before + 1


async def test_voice_change_between_turns(gateway: Gateway) -> None:
    # Pipecat's usual Language.EN is the voice's en-US
    settings = GatewayTTSSettings(speed=1.0, language=Language.EN)
    async with pipeline(gateway, settings=settings) as h:
        assert h.tts.effective_config["language"] == "en-US"
        await h.send(TTSSpeakFrame("First turn."))
        await h.down.wait_for(lambda: len(h.down.of(TTSStoppedFrame)) == 1)
        await h.send(TTSUpdateSettingsFrame(delta=GatewayTTSSettings(speed=2.0)))
        await h.send(TTSSpeakFrame("First turn."))
        await h.down.wait_for(lambda: len(h.down.of(TTSStoppedFrame)) == 2)
        updated = h.tts.of("session.updated")
        assert updated and updated[-1]["config"]["speed"] == 2.0
        one, two = (s.context_id for s in h.down.of(TTSStoppedFrame))
        ms_one = h.tts.of("session.done", one)[0]["metrics"]["audio_ms"]
        ms_two = h.tts.of("session.done", two)[0]["metrics"]["audio_ms"]
        assert ms_two < ms_one  # the same text, twice as fast
        assert not h.up.of(ErrorFrame)


async def test_gateway_down_is_reported_as_a_pipecat_error(gateway: Gateway) -> None:
    from voice_gateway_wire.testing import free_port

    url = f"ws://127.0.0.1:{free_port()}/v1/audio/speech/stream"

    class Down:
        ws_url = url

    async with pipeline(Down(), reconnect_on_error=False) as h:  # type: ignore[arg-type]
        await h.up.wait_for(lambda: bool(h.up.of(ErrorFrame)))
        assert "voice gateway connection failed" in h.up.of(ErrorFrame)[0].error


async def test_dropped_connection_reconnects_and_never_resends(
    no_resume_gateway: Gateway,
) -> None:
    """A gateway that does not resume: the drop ends the session, the text
    in flight is reported, a new session starts."""
    gateway = no_resume_gateway
    proxy = DroppingProxy(gateway.port)
    await proxy.start()

    class ViaProxy:
        ws_url = f"ws://127.0.0.1:{proxy.port}/v1/audio/speech/stream"

    utterances = gateway.metric("gateway_utterances_total")
    try:
        async with pipeline(
            ViaProxy(),  # type: ignore[arg-type]
            reconnect_backoff_min_wait=0.1,
            reconnect_backoff_max_wait=0.5,
        ) as h:
            first_session = h.tts.server_info["session_id"]
            reconnected = asyncio.Event()

            @h.tts.event_handler("on_connected")
            async def _connected(service: GatewayTTSService) -> None:
                reconnected.set()

            await h.send(TTSSpeakFrame(LONG_TEXT))
            await h.down.wait_for(lambda: bool(h.down.of(TTSAudioRawFrame)))
            proxy.drop_all()
            # the text in flight is reported as not spoken ...
            await h.up.wait_for(lambda: any("not spoken" in e.error for e in h.up.of(ErrorFrame)))
            # ... and the service reconnects: a new gateway session
            async with asyncio.timeout(HANG_GUARD_S):
                await reconnected.wait()
            assert h.tts.server_info["session_id"] != first_session
            await h.send(TTSSpeakFrame("After the drop."))
            await h.down.wait_for(
                lambda: any(
                    h.tts.of("session.done", f.context_id) for f in h.down.of(TTSStoppedFrame)
                )
            )
    finally:
        await proxy.aclose()
    # two utterances reached the gateway: the dropped text was never re-sent
    assert gateway.metric("gateway_utterances_total") == utterances + 2


async def test_a_drop_mid_reply_is_resumed_and_the_reply_goes_on(gateway: Gateway) -> None:
    """The gateway resumes (its default ``resume_window_s``): Pipecat's
    reconnect takes the same session back, the reply's audio continues
    without a gap or a repeat (what the pipeline got is what session.done
    reports), its words reach the context once, nothing is reported lost,
    and text given during the drop is spoken after it."""
    proxy = DroppingProxy(gateway.port)
    await proxy.start()

    class ViaProxy:
        ws_url = f"ws://127.0.0.1:{proxy.port}/v1/audio/speech/stream"

    utterances = gateway.metric("gateway_utterances_total")
    try:
        async with pipeline(
            ViaProxy(),  # type: ignore[arg-type]
            reconnect_backoff_min_wait=0.1,
            reconnect_backoff_max_wait=0.5,
        ) as h:
            session_id = h.tts.server_info["session_id"]
            await h.send(TTSSpeakFrame(LONG_TEXT))
            await h.down.wait_for(lambda: len(h.down.of(TTSAudioRawFrame)) >= 5)
            first = _context_of_first_audio(h.down)
            proxy.drop_all()
            await h.send(TTSSpeakFrame("After the drop."))
            await h.down.wait_for(lambda: len(h.down.of(TTSStoppedFrame)) == 2)
            assert h.tts.resumes == 1
            assert h.tts.server_info["session_id"] == session_id
            second = next(f.context_id for f in h.down.of(TTSStoppedFrame) if f.context_id != first)
            for context_id in (first, second):
                (done,) = h.tts.of("session.done", context_id)
                assert not done["cancelled"]
                audio = h.down.of(TTSAudioRawFrame, context_id)
                delivered_ms = sum(len(f.audio) for f in audio) / 2 / PIPELINE_RATE * 1000
                assert delivered_ms == pytest.approx(done["metrics"]["audio_ms"], abs=1.0)
            # the words that reached the context: each once, in order
            words = "".join(f.text.strip() for f in h.down.of(TTSTextFrame))
            assert words == (LONG_TEXT + "After the drop.").replace(" ", "")
            assert not [e for e in h.up.of(ErrorFrame) if "not spoken" in e.error]
    finally:
        await proxy.aclose()
    # each text reached the gateway once
    assert gateway.metric("gateway_utterances_total") == utterances + 2
