"""The audio stream driven alone: a real engine (the synthetic one, and two
small engines built on it that fail on purpose), a sender that records what
it is given, and a host that records what the stream reports.  No server,
no session core.

The host applies nothing: it records each session-wide report and answers
with a marker message, so these tests also show that the stream writes none
of the context's, utterance's or segment's text-side fields (the core owns
them), that it writes what it sent in the ledger (``Context.audio``,
``Utterance.audio``, ``Segment.audio``) and that it sends the core's
answers in order with its audio.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import msgspec
import numpy as np
import pytest

from gateway import protocol
from gateway.audio.encoding import encode
from gateway.audio.framing import FrameFlags, unpack_frame
from gateway.audio.resample import StreamResampler
from gateway.engines.synthetic import ToneWork
from gateway.errors import ErrorCode
from gateway.flow.budget import DecodeBudget
from gateway.flow.listener import Listener
from gateway.ops.metrics import Metrics
from gateway.session.audio_stream import AudioStream, QueuedSegment, StreamEnv
from gateway.session.config import apply_config, default_config
from gateway.session.contexts import Context
from gateway.session.utterance import Segment, Utterance
from gateway.text.policy import SegmentPolicy
from gateway.text.segmenter import Segmenter
from tests.conftest import test_settings as make_settings
from tests.session.faulty_engine import FaultyEngine


class RecordingSender:
    def __init__(self) -> None:
        self.gone = False
        #: ("event", message) and ("audio", payload), in order
        self.log: list[tuple[str, Any]] = []

    async def event(self, message: protocol.ServerMessage) -> None:
        self.log.append(("event", message))

    async def audio(self, payload: bytes, counted_as: str | None = None) -> None:
        self.log.append(("audio", payload))

    def payloads(self) -> list[bytes]:
        return [p for kind, p in self.log if kind == "audio"]

    def markers(self) -> list[str]:
        return [
            str(m.id) for kind, m in self.log if kind == "event" and isinstance(m, protocol.Pong)
        ]


def _marker(name: str) -> list[protocol.ServerMessage]:
    return [protocol.Pong(id=name)]


class RecordingHost:
    """Records the session-wide events the stream reports."""

    def __init__(self) -> None:
        self.reports: list[tuple[Any, ...]] = []
        self.dequeued = asyncio.Event()
        self.cancelled = asyncio.Event()

    def segment_dequeued(self, ctx: Context) -> list[protocol.ServerMessage]:
        self.reports.append(("dequeued",))
        self.dequeued.set()
        return _marker("dequeued")

    def cancelled_audio_ended(
        self, ctx: Context, open_segment: Segment | None, *, delivered: bool
    ) -> list[protocol.ServerMessage]:
        if open_segment is not None:
            self.reports.append(("cancel", open_segment.index, delivered))
            self.cancelled.set()
        return []

    def connection_lost(self) -> None:
        self.reports.append(("lost",))

    def listener_silent(self, ctx: Context) -> list[protocol.ServerMessage]:
        self.reports.append(("silent",))
        return []


class Rig:
    def __init__(
        self, host: RecordingHost | None = None, listener: Listener | None = None, **config: Any
    ) -> None:
        settings = make_settings(engine="synthetic")
        self.engine = FaultyEngine(settings)
        voice = self.engine.voices()[0]
        self.config = apply_config(
            default_config(voice, self.engine.name),
            msgspec.convert({"type": "session.config", **config}, protocol.SessionConfig),
            self.engine.voices(),
            self.engine.name,
        )
        self.out = RecordingSender()
        self.host = host or RecordingHost()
        env = StreamEnv(
            engine=self.engine,
            voice_rates={voice.name: voice.sample_rate},
            budget=DecodeBudget(10.0),
            out=self.out,
            label="test",
            log=logging.LoggerAdapter(logging.getLogger("tests.audio_stream"), {}),
            host=self.host,
            metrics=Metrics(),
        )
        self.stream = AudioStream(env, "test")
        self.context = Context(id="c", number=7, policy=SegmentPolicy(Segmenter("auto")))
        if listener is not None:
            self.context.listener = listener
        self.utterance = Utterance(index=0, config=self.config)

    async def __aenter__(self) -> Rig:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stream.stop()

    def speak(self, *texts: str) -> None:
        for text in texts:
            segment = self.utterance.add_segment(text)
            self.stream.enqueue(QueuedSegment(self.context, self.utterance, segment))

    async def until_dequeued(self, count: int) -> None:
        async with asyncio.timeout(10):
            while sum(r[0] == "dequeued" for r in self.host.reports) < count:
                self.host.dequeued.clear()
                await self.host.dequeued.wait()


def _rig(listener: Listener | None = None, **config: Any) -> Rig:
    return Rig(None, listener, **{"stream_audio": True, "response_format": "pcm", **config})


def _events(rig: Rig) -> list[protocol.ServerMessage]:
    return [m for kind, m in rig.out.log if kind == "event"]


def _done(rig: Rig) -> list[protocol.AudioDone]:
    return [m for m in _events(rig) if isinstance(m, protocol.AudioDone)]


def _errors(rig: Rig) -> list[protocol.Error]:
    return [m for m in _events(rig) if isinstance(m, protocol.Error)]


def _tone(text: str) -> np.ndarray:
    """The synthetic engine's audio for ``text``, computed offline."""
    work = ToneWork(text, 1.0)
    _, durations = work.prepare()
    return np.concatenate([work.decode(i) for i in range(len(durations))])


def _snapshot(*objects: Any) -> list[dict[str, Any]]:
    """Each dataclass's text-side fields (lists copied; other values by
    identity or value); ``audio`` is the ledger, the stream's to write."""
    return [
        {f.name: _copied(getattr(o, f.name)) for f in dataclasses.fields(o) if f.name != "audio"}
        for o in objects
    ]


def _copied(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


async def test_segments_are_reported_in_order_with_their_audio() -> None:
    texts = ("One two three.", "Four five.")
    async with _rig(timestamps=True) as rig:
        rig.speak(*texts)  # the task starts at the first await
        before = _snapshot(rig.context, rig.utterance, *rig.utterance.segments)
        await rig.until_dequeued(2)
    assert rig.host.reports == [("dequeued",)] * 2  # no report per segment or frame
    # the events about each segment go out in order with its audio, then
    # the core's answer
    kinds = [
        "audio" if kind == "audio" else str(getattr(m, "id", type(m).__name__))
        for kind, m in rig.out.log
    ]
    first = kinds[: kinds.index("AudioDone")]
    assert first[:2] == ["AudioStart", "Alignment"] and set(first[2:]) == {"audio"}
    events = [k for k in kinds if k != "audio"]
    assert events == ["AudioStart", "Alignment", "AudioDone", "dequeued"] * 2
    # each segment's figures are what it sent: s16 PCM at the native rate
    for done, segment, text in zip(_done(rig), rig.utterance.segments, texts, strict=True):
        ledger = segment.audio
        assert not done.error and done.sentence_index == texts.index(text)
        assert ledger.samples == len(_tone(text)) and ledger.sent_bytes == 2 * ledger.samples
        assert done.total_bytes == ledger.sent_bytes and ledger.finished
        assert ledger.words is not None and ledger.first_sequence is None  # raw framing
    messages = sum(s.audio.messages for s in rig.utterance.segments)
    assert messages == len(rig.out.payloads())  # the ledger counts each message sent
    # the stream wrote none of the core's fields; its ledger, and the
    # listener's count of what was sent, hold all of it
    assert _snapshot(rig.context, rig.utterance, *rig.utterance.segments) == before
    total_ms = sum(len(_tone(t)) for t in texts) * 1000 / 22050
    assert rig.utterance.audio.sent_ms == pytest.approx(total_ms)
    assert rig.context.listener.sent_ms == pytest.approx(total_ms)
    assert rig.context.audio.sequence == 0  # raw framing: no sequence numbers


async def test_resampled_segments_of_an_utterance_join_as_one_signal() -> None:
    """Both segments are queued at once, so the resampler's state carries
    from the first to the second: the audio equals the whole signal
    resampled at once."""
    texts = ("Hello there.", "How are you today?")
    async with _rig(sample_rate=16000) as rig:
        rig.speak(*texts)
        await rig.until_dequeued(2)
    offline = StreamResampler(22050, 16000)
    signal = np.concatenate([_tone(t) for t in texts])
    whole = np.concatenate([offline.process(signal), offline.flush()])
    assert b"".join(rig.out.payloads()) == encode(whole, "pcm_s16le")


async def test_an_engine_refusal_fails_its_segment_with_the_engine_code() -> None:
    async with _rig() as rig:
        rig.speak("Please refuse this.", "Then go on.")
        await rig.until_dequeued(2)
    (failure,) = _errors(rig)
    assert failure.code == ErrorCode.ENGINE_REFUSED
    assert "the reference audio cannot be read" in failure.message
    refused, after = rig.utterance.segments
    assert (refused.audio.sent_bytes, refused.audio.samples) == (0, 0)
    assert [d.error for d in _done(rig)] == [True, False]  # the stream goes on
    assert after.audio.samples > 0


async def test_an_exception_that_is_not_a_synthesis_error_is_internal_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _rig() as rig:
        rig.speak("Give me stereo now.", "Then go on.")
        with caplog.at_level(logging.ERROR, logger="tests.audio_stream"):
            await rig.until_dequeued(2)
    (failure,) = _errors(rig)
    assert failure.code == ErrorCode.INTERNAL
    assert "mono" not in failure.message and "ValueError" not in failure.message
    assert [d.error for d in _done(rig)] == [True, False]
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None and "expected mono" in str(record.exc_info[1])


async def test_a_cancel_drops_held_frames_and_reports_after_the_last_one_sent() -> None:
    """A listener that never reports holds the frames after the first 100 ms;
    the cancel drops them and the report counts only what went out."""
    listener = Listener("ack", 100)
    async with _rig(listener) as rig:
        host = rig.host
        rig.speak("A long sentence that takes a while to speak out loud.", "And another one.")
        async with asyncio.timeout(10):
            while listener.sent_ms < 100:
                await asyncio.sleep(0.01)
        sent_before = b"".join(rig.out.payloads())
        rig.utterance.cancelled = True  # the core's write
        assert rig.stream.cancel([rig.utterance])  # it was being spoken
        listener.interrupt()
        async with asyncio.timeout(10):
            await host.cancelled.wait()
        assert not rig.stream.queue  # the next segment was dropped
    (cancel,) = [r for r in host.reports if r[0] == "cancel"]
    assert cancel == ("cancel", 0, True)
    # the report's figures: the ledger counts only what went out
    assert rig.utterance.segments[0].audio.sent_bytes == len(sent_before)
    assert b"".join(rig.out.payloads()) == sent_before  # nothing after the cancel
    assert not _done(rig)


async def test_tagged_frames_carry_the_ledgers_positions() -> None:
    """The header's positions are the ledger's: the context's sequence goes
    on from where it was (+1 a message), the sample offset from the
    utterance's audio sent; the stream flags the segment's first and last
    frames itself."""
    async with _rig(framing="tagged") as rig:
        rig.context.audio.sequence = 41
        rig.utterance.audio.sent_ms = 1000.0
        rig.speak("Short one.")
        await rig.until_dequeued(1)
    headers = [unpack_frame(p)[0] for p in rig.out.payloads()]
    assert len(headers) > 2
    assert {(h.context, h.utterance_index) for h in headers} == {(7, 0)}
    assert [h.sequence for h in headers] == list(range(41, 41 + len(headers)))
    assert rig.context.audio.sequence == 41 + len(headers)
    assert rig.utterance.segments[0].audio.first_sequence == 41
    offsets = [h.sample_offset for h in headers]
    assert offsets[0] == 22050 and offsets == sorted(offsets)
    frame_samples = [(len(unpack_frame(p)[1])) // 2 for p in rig.out.payloads()]
    assert offsets[1:] == [22050 + sum(frame_samples[: i + 1]) for i in range(len(offsets) - 1)]
    assert [bool(h.flags & FrameFlags.FIRST) for h in headers] == [True] + [False] * (
        len(headers) - 1
    )
    assert bool(headers[-1].flags & FrameFlags.LAST)
