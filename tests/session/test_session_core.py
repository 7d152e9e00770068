"""The session core driven without a server.

``Session.handle`` returns what to send; these tests read those actions
directly.  Audio still goes through real ``AudioStream`` tasks on the real
synthetic engine, into a sender that records what it is given (the thing
under test is the core, not the transport: tests/test_stream.py and
tests/flow/test_backpressure.py cover the socket).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway import protocol
from gateway.engines.base import SegmentStats, WordTiming
from gateway.engines.synthetic import SyntheticEngine
from gateway.errors import CloseCode, ErrorCode, GatewayError
from gateway.flow.admission import AdmissionGate, SlotQueue
from gateway.ops.metrics import Metrics
from gateway.session import segment_events
from gateway.session.audio_stream import QueuedSegment
from gateway.session.cancel_report import cancel_report, heard_position
from gateway.session.core import AnswerVoiceRequest, Close, CloseWhenDone, Session, State
from gateway.session.endings import Endings
from gateway.session.ledger import ContextAudio, SegmentAudio
from gateway.session.streams import SessionStreams
from gateway.session.utterance import Utterance
from gateway.session.voice_requests import VoiceDesk
from gateway.voices.store import VoiceStore
from tests.conftest import test_settings as make_settings
from tests.session.faulty_engine import CRASH_TEXT, FaultyEngine

CONFIG = protocol.SessionConfig(voice="tone", stream_audio=True, response_format="pcm")


class RecordingSender:
    """Collects what the audio streams send, in order."""

    def __init__(self) -> None:
        self.gone = False
        self.events: list[protocol.ServerMessage] = []
        self.frames = 0
        self.changed = asyncio.Event()

    async def event(self, message: protocol.ServerMessage) -> None:
        self.events.append(message)
        self.changed.set()

    async def audio(self, payload: bytes, counted_as: str | None = None) -> None:
        self.frames += 1

    async def wait_for(self, kind: type[Any], count: int = 1) -> None:
        async with asyncio.timeout(10):
            while sum(isinstance(e, kind) for e in self.events) < count:
                self.changed.clear()
                await self.changed.wait()


class Harness:
    def __init__(self, engine: type[SyntheticEngine] = SyntheticEngine, **overrides: Any) -> None:
        self.settings = make_settings(engine="synthetic", **overrides)
        self.engine = engine(self.settings)
        s = self.settings
        self.admission = AdmissionGate(
            SlotQueue(
                s.max_active_streams,
                s.admission_queue_length,
                s.admission_deadline_s,
            ),
            Metrics().admission("ws"),
        )
        self.out = RecordingSender()
        self.session = Session(self.engine, self.settings, Metrics(), self.admission, self.out)

    def handle(self, message: protocol.ClientMessage) -> list[Any]:
        return self.session.handle(message)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = Harness()
    yield harness
    await harness.session.shutdown()


def _types(actions: list[Any]) -> list[type[Any]]:
    return [type(a) for a in actions]


def _error(actions: list[Any]) -> protocol.Error:
    assert actions and isinstance(actions[0], protocol.Error), actions
    return actions[0]


# --- config -------------------------------------------------------------------------


async def test_config_returns_session_updated(h: Harness) -> None:
    (updated,) = h.handle(protocol.SessionConfig(speed=1.5, timestamps=True))
    assert isinstance(updated, protocol.SessionUpdated)
    assert updated.config.speed == 1.5 and updated.config.timestamps
    assert h.session.config is updated.config


async def test_a_bad_first_config_is_fatal_a_later_one_is_not(h: Harness) -> None:
    actions = h.handle(protocol.SessionConfig(model="gpt-5"))
    error = _error(actions)
    assert error.code == ErrorCode.INVALID_CONFIG and error.fatal
    assert actions[1] == Close(CloseCode.POLICY, "invalid_config")
    h.handle(CONFIG)
    actions = h.handle(protocol.SessionConfig(model="gpt-5", speed=2.0))
    assert _types(actions) == [protocol.Error] and not _error(actions).fatal
    assert h.session.config.speed != 2.0  # all or nothing


async def test_an_unknown_voice_is_never_fatal(h: Harness) -> None:
    """Protocol 1.1.0: not even in the first config; refused whole."""
    actions = h.handle(protocol.SessionConfig(voice="Vivian", speed=2.0))
    assert _types(actions) == [protocol.Error]
    error = _error(actions)
    assert error.code == ErrorCode.UNKNOWN_VOICE and not error.fatal
    assert "'Vivian'" in error.message and "tone" in error.message
    assert h.session.config.voice == "tone" and h.session.config.speed == 1.0


async def test_framing_cannot_change_mid_utterance(h: Harness) -> None:
    h.handle(CONFIG)
    h.handle(protocol.InputText(text="Half a sentence"))
    error = _error(h.handle(protocol.SessionConfig(framing="tagged")))
    assert error.code == ErrorCode.INVALID_STATE and not error.fatal


# --- text, flush, done --------------------------------------------------------------


async def test_text_is_buffered_until_a_sentence_ends(h: Harness) -> None:
    h.handle(CONFIG)
    assert h.handle(protocol.InputText(text="Hello there")) == []
    assert h.session.busy() and not h.session.producing()  # buffered, not speaking
    assert h.handle(protocol.InputText(text=" friend. And")) == []
    assert h.session.producing()  # "Hello there friend." went to the stream
    await h.out.wait_for(protocol.AudioDone)
    start = next(e for e in h.out.events if isinstance(e, protocol.AudioStart))
    assert start.sentence_text == "Hello there friend."
    assert h.out.frames > 0


async def test_flush_speaks_what_is_buffered(h: Harness) -> None:
    h.handle(CONFIG)
    h.handle(protocol.InputText(text="no full stop here"))
    assert h.handle(protocol.InputFlush()) == []
    await h.out.wait_for(protocol.AudioDone)
    assert h.out.events[0].sentence_text == "no full stop here"  # type: ignore[union-attr]
    # the utterance is open until input.done; with its committed text spoken
    # it streams no more, and the session keeps its admission
    await _speaking_becomes(h.session, False)
    assert h.session.busy() and h.session.admitted and h.admission.active == 1


async def _speaking_becomes(session: Session, speaking: bool) -> None:
    async with asyncio.timeout(5):
        while session.speaking() != speaking:
            await asyncio.sleep(0.01)


async def _slots_become(h: Harness, active: int) -> None:
    async with asyncio.timeout(5):
        while h.admission.active != active:
            await asyncio.sleep(0.01)


#: never more than 100 ms ahead of a listener that never reports: a
#: committed segment stays in progress (and holds its slot) until cancelled
HELD = protocol.SessionConfig(
    voice="tone", stream_audio=True, response_format="pcm", flow_control="ack", max_lead_ms=100
)


async def test_uncommitted_text_does_not_admit_the_session(h: Harness) -> None:
    h.handle(protocol.SessionConfig(split_granularity="none"))
    for cid in "abcdefgh":
        assert h.handle(protocol.InputText(text="hold ", context_id=cid)) == []
    assert h.session.busy() and h.admission.active == 0 and not h.session.admitted
    # the first commit admits the session; the committed text is spoken and
    # the session keeps its admission while it lives
    assert h.handle(protocol.InputFlush(context_id="a")) == []
    assert h.admission.active == 1 and h.session.admitted
    await _speaking_becomes(h.session, False)
    assert h.admission.active == 1
    await h.session.shutdown()
    assert h.admission.active == 0


def _listening(h: Harness, session: Session) -> list[list[Any]]:
    """Deliver ``session``'s admission decisions (as the endpoint does)."""
    decided: list[list[Any]] = []
    session.slot_listener = lambda ticket: decided.append(session.slot_event(ticket))
    return decided


def _started(out: RecordingSender, cid: str | None) -> bool:
    return any(isinstance(e, protocol.AudioStart) and e.context_id == cid for e in out.events)


async def test_a_session_share_delays_its_third_context_never_refuses() -> None:
    h = Harness(max_streams_per_session=2)
    other = Session(h.engine, h.settings, Metrics(), h.admission, RecordingSender())
    try:
        h.handle(HELD)
        h.handle(protocol.SessionConfig(framing="tagged"))  # a stream per context
        for cid in "ab":
            h.handle(protocol.InputText(text="Speak now please.", context_id=cid))
            h.handle(protocol.InputFlush(context_id=cid))
        assert h.admission.active == 1  # one admitted session, two streams
        # a third context is accepted and waits for one of the session's own
        assert h.handle(protocol.InputText(text="Third one.", context_id="c")) == []
        assert h.handle(protocol.InputFlush(context_id="c")) == []
        await asyncio.sleep(0.05)
        assert not _started(h.out, "c")
        # another session is admitted beside it
        assert other.handle(protocol.InputText(text="Another session.")) == []
        assert other.handle(protocol.InputFlush()) == []
        assert h.admission.active == 2
        # a cancel frees the session's share: the third context streams
        h.handle(protocol.Cancel(context_id="a"))
        async with asyncio.timeout(5):
            while not _started(h.out, "c"):
                await asyncio.sleep(0.01)
        assert not any(
            isinstance(e, protocol.Error) and e.code == ErrorCode.BUSY for e in h.out.events
        )
    finally:
        await other.shutdown()
        await h.session.shutdown()
    assert h.admission.active == 0


async def test_an_admitted_session_is_never_refused_while_the_door_is_closed() -> None:
    """One slot: the admitted session speaks reply after reply, on several
    contexts, while another session waits at the door; none of its text is
    refused, and the waiting session is served once the first one ends."""
    h = Harness(max_active_streams=1, admission_deadline_s=30)
    other_out = RecordingSender()
    other = Session(h.engine, h.settings, Metrics(), h.admission, other_out)
    _listening(h, h.session)
    other_decided = _listening(h, other)
    try:
        h.handle(CONFIG)
        other.handle(CONFIG)
        h.handle(protocol.InputText(text="First reply."))
        h.handle(protocol.InputFlush())
        assert h.session.admitted
        other.handle(protocol.InputText(text="Let me in."))
        other.handle(protocol.InputDone())
        assert h.admission.queue.depth == 1 and not other.admitted
        for i in range(4):
            cid = "ab"[i % 2]
            await _speaking_becomes(h.session, False)
            assert h.handle(protocol.InputText(text=f"Reply {i}.", context_id=cid)) == []
            assert h.handle(protocol.InputDone(context_id=cid)) == []
        await h.out.wait_for(protocol.SessionDone, 4)
        assert not any(isinstance(e, protocol.Error) for e in h.out.events)
        assert not other_out.events  # still waiting, nothing spoken
        await h.session.shutdown()  # the session ends: its admission goes to the next
        await other_out.wait_for(protocol.SessionDone)
        assert other.admitted and other_decided == [[]]
        done = [e for e in other_out.events if isinstance(e, protocol.SessionDone)][-1]
        assert not done.cancelled and done.metrics is not None
        assert done.metrics.admission_wait_ms > 0
    finally:
        await other.shutdown()
        await h.session.shutdown()
    assert h.admission.active == 0 and h.admission.queue.depth == 0


async def test_text_of_a_session_waiting_at_the_door_is_held_then_all_spoken() -> None:
    """While a session waits at the door its text is held unread (no
    segments pile up, no timer runs); let in, it speaks every word, in
    order; refused, the held text is reported as not spoken."""
    h = Harness(max_active_streams=1, admission_deadline_s=30)
    other_out = RecordingSender()
    other = Session(h.engine, h.settings, Metrics(), h.admission, other_out)
    _listening(h, other)
    words = "Then the second. And a third one, which runs on for a while."
    try:
        h.handle(HELD)
        other.handle(CONFIG)
        h.handle(protocol.InputText(text="Takes the slot."))
        h.handle(protocol.InputFlush())
        assert other.handle(protocol.InputText(text="At the door. ")) == []
        assert other.handle(protocol.InputFlush()) == []  # committed: it waits at the door
        ctx = other.contexts.get(None)
        assert ctx is not None and not other.admitted
        assert [s.text for s in ctx.utterance.segments] == ["At the door."]  # type: ignore[union-attr]
        for word in words.split(" "):
            assert other.handle(protocol.InputText(text=word + " ")) == []
            assert ctx.segment_timer is None
        assert len(ctx.utterance.segments) == 1  # type: ignore[union-attr]
        assert ctx.policy.holding and ctx.policy.buffered == words + " "
        await h.session.shutdown()  # the door opens: the held text is cut and spoken
        await _speaking_becomes(other, True)
        assert other.admitted and not ctx.policy.holding
        assert other.handle(protocol.InputDone()) == []
        await other_out.wait_for(protocol.SessionDone)
        spoken = [e.sentence_text for e in other_out.events if isinstance(e, protocol.AudioStart)]
        assert " ".join(spoken) == "At the door. " + words
        assert not any(isinstance(e, protocol.Error) for e in other_out.events)
    finally:
        await other.shutdown()
        await h.session.shutdown()
    assert h.admission.active == 0


async def test_a_commit_at_a_full_door_without_a_queue_is_refused_and_keeps_the_text() -> None:
    """With no admission queue (``admission_queue_length = 0``) a session
    that is not admitted and finds the door closed is refused at once; its
    text stays buffered for a later try."""
    h = Harness(max_active_streams=1, admission_queue_length=0)
    other_out = RecordingSender()
    other = Session(h.engine, h.settings, Metrics(), h.admission, other_out)
    try:
        h.handle(HELD)
        other.handle(HELD)
        other.handle(protocol.InputText(text="waiting words"))  # commits nothing
        h.handle(protocol.InputText(text="Takes the slot.", context_id="a"))
        h.handle(protocol.InputFlush(context_id="a"))
        assert h.admission.active == 1
        # the admitted session commits on another context: never refused
        assert h.handle(protocol.InputText(text="More of mine.", context_id="b")) == []
        assert h.handle(protocol.InputFlush(context_id="b")) == []
        for message in (protocol.InputFlush(), protocol.InputDone()):
            error = _error(other.handle(message))
            assert error.code == ErrorCode.BUSY and "stays buffered" in error.message
            assert error.retry_after_ms is not None
        await h.session.shutdown()
        assert h.admission.active == 0
        other.handle(protocol.SessionConfig(flow_control="none"))
        other.handle(protocol.InputDone())  # now it commits
        async with asyncio.timeout(5):
            while not _started(other_out, None):
                await asyncio.sleep(0.01)
        spoken = [e for e in other_out.events if isinstance(e, protocol.AudioStart)]
        assert spoken[-1].sentence_text == "waiting words"
    finally:
        await other.shutdown()
        await h.session.shutdown()
    assert h.admission.active == 0


async def test_a_session_that_waits_past_the_deadline_is_busy_before_any_audio() -> None:
    h = Harness(max_active_streams=1, admission_deadline_s=0.1)
    other = Session(h.engine, h.settings, Metrics(), h.admission, RecordingSender())
    decided = _listening(h, other)
    try:
        h.handle(HELD)
        other.handle(HELD)
        h.handle(protocol.InputText(text="Takes the slot.", context_id="a"))
        h.handle(protocol.InputFlush(context_id="a"))
        other.handle(protocol.InputText(text="Never gets one.", context_id="b"))
        other.handle(protocol.InputFlush(context_id="b"))
        other.handle(protocol.InputText(text="Nor this.", context_id="c"))
        other.handle(protocol.InputFlush(context_id="c"))
        other.handle(protocol.InputText(text="Held, unread.", context_id="c"))
        async with asyncio.timeout(5):
            while not decided:
                await asyncio.sleep(0.01)
        (actions,) = decided
        assert _types(actions) == [
            protocol.Error,
            protocol.AudioCancelled,
            protocol.SessionDone,
            protocol.Error,
            protocol.AudioCancelled,
            protocol.SessionDone,
        ]
        error = actions[0]
        assert error.code == ErrorCode.BUSY and not error.fatal and error.context_id == "b"
        assert error.retry_after_ms == 1000 and "within 0.1 s" in error.message
        assert "another server" in error.message
        assert error.waited_ms is not None and 100 <= error.waited_ms < 1000  # the deadline
        assert actions[1].unspoken_text == "Never gets one." and actions[1].spoken_text == ""
        assert actions[2].cancelled and actions[3].context_id == "c"
        assert actions[4].unspoken_text == "Nor this. Held, unread."
        assert h.admission.queue.depth == 0 and h.admission.active == 1
        assert not other.speaking() and not other.admitted
        # the admitted session's next commit is still never refused
        assert h.handle(protocol.InputText(text="Mine.", context_id="z")) == []
        assert h.handle(protocol.InputFlush(context_id="z")) == []
    finally:
        await other.shutdown()
        await h.session.shutdown()
    assert h.admission.active == 0


async def test_a_cancel_of_a_session_waiting_at_the_door_leaves_the_queue() -> None:
    h = Harness(max_active_streams=1)
    other = Session(h.engine, h.settings, Metrics(), h.admission, RecordingSender())
    try:
        h.handle(HELD)
        other.handle(HELD)
        h.handle(protocol.InputText(text="Takes the slot.", context_id="a"))
        h.handle(protocol.InputFlush(context_id="a"))
        other.handle(protocol.InputText(text="Waits. And waits more", context_id="b"))
        other.handle(protocol.InputFlush(context_id="b"))
        assert h.admission.queue.depth == 1
        actions = other.handle(protocol.Cancel(context_id="b"))
        assert _types(actions) == [protocol.AudioCancelled, protocol.SessionDone]
        assert actions[0].unspoken_text == "Waits. And waits more"
        assert h.admission.queue.depth == 0 and h.admission.active == 1
        assert not other._has_work(other.contexts.get("b"))  # type: ignore[arg-type]
    finally:
        await other.shutdown()
        await h.session.shutdown()
    assert h.admission.active == 0


async def test_done_sends_session_done_after_the_audio(h: Harness) -> None:
    h.handle(CONFIG)
    h.handle(protocol.InputText(text="One. Two."))
    assert h.handle(protocol.InputDone()) == []  # audio in flight: the stream reports
    await h.out.wait_for(protocol.SessionDone)
    done = h.out.events[-1]
    assert isinstance(done, protocol.SessionDone) and done.total_sentences == 2
    assert not done.cancelled and not h.session.speaking() and h.admission.active == 1


async def test_an_empty_utterance_is_done_at_once(h: Harness) -> None:
    h.handle(CONFIG)
    (done,) = h.handle(protocol.InputDone())
    assert isinstance(done, protocol.SessionDone) and done.total_sentences == 0


async def test_text_limits(h: Harness) -> None:
    h.handle(CONFIG)
    big = "a" * (h.settings.max_input_text_bytes + 1)
    error = _error(h.handle(protocol.InputText(text=big)))
    assert error.code == ErrorCode.TEXT_TOO_LONG and not error.fatal
    chunk = "word " * (h.settings.max_input_text_bytes // 10)
    for _ in range(h.settings.max_utterance_chars // len(chunk)):
        assert h.handle(protocol.InputText(text=chunk, context_id="c")) == []
    error = _error(h.handle(protocol.InputText(text=chunk, context_id="c")))
    assert error.code == ErrorCode.TEXT_TOO_LONG and error.context_id == "c"


async def test_policy_timer_cuts_the_first_segment() -> None:
    """No more text arrives: the policy's timer still cuts the first segment
    at the earliest word boundary with ``first_segment_min_words`` words."""
    h = Harness()
    try:
        h.handle(CONFIG)
        h.handle(protocol.InputText(text="one two three four five six seven"))
        await h.out.wait_for(protocol.AudioStart)
        start = h.out.events[0]
        assert isinstance(start, protocol.AudioStart)
        assert start.sentence_text == "one two three four"
    finally:
        await h.session.shutdown()


# --- cancel -------------------------------------------------------------------------


async def test_cancel_of_buffered_text_reports_at_once(h: Harness) -> None:
    h.handle(CONFIG)
    h.handle(protocol.InputText(text="never spoken", context_id="a"))
    actions = h.handle(protocol.Cancel(context_id="a"))
    assert _types(actions) == [protocol.AudioCancelled, protocol.SessionDone]
    cancelled = actions[0]
    assert cancelled.unspoken_text == "never spoken" and cancelled.spoken_text == ""
    assert actions[1].cancelled and not h.session.speaking()
    assert h.handle(protocol.Cancel(context_id="a")) == []  # nothing left to cancel


async def test_cancel_of_audio_in_flight_is_reported_by_the_stream(h: Harness) -> None:
    h.handle(CONFIG)
    h.handle(protocol.InputText(text="A long sentence that takes a while to speak out loud."))
    h.handle(protocol.InputFlush())  # its end is decided: speak it now
    await h.out.wait_for(protocol.AudioStart)
    assert h.handle(protocol.Cancel()) == []  # the report follows the last frame
    await h.out.wait_for(protocol.SessionDone)
    kinds = [type(e) for e in h.out.events]
    assert kinds[-3:] == [protocol.AudioCancelled, protocol.AudioDone, protocol.SessionDone]
    assert not h.session.speaking() and h.admission.active == 1


def _utterance(*sentences: tuple[str, float, float, bool]) -> Utterance:
    """Sentences as (text, start_ms, audio_ms, finished), all started; words
    spread evenly over the audio."""
    utt = Utterance(index=3, config=protocol.EffectiveConfig(**_DEFAULTS))
    for text, start, length, finished in sentences:
        s = utt.add_segment(text).audio
        s.started, s.finished, s.start_ms, s.audio_ms = True, finished, start, length
        words = text.split()
        span = length / len(words)
        s.words = tuple(WordTiming(w, i * span, (i + 1) * span) for i, w in enumerate(words))
        utt.audio.sent_ms = start + length
    return utt


_DEFAULTS: dict[str, Any] = dict(
    voice="tone",
    language="en-US",
    speed=1.0,
    response_format="pcm",
    stream_audio=True,
    encoding="pcm_s16le",
    sample_rate=22050,
    frame_ms=20,
    frame_samples=441,
    split_granularity="auto",
    flow_control="none",
    max_lead_ms=1000,
    timestamps=False,
    framing="raw",
    model="synthetic",
)


@pytest.mark.parametrize(
    ("position", "offset", "heard", "spoken", "unspoken"),
    [
        (0.0, 0.0, 0.0, "", "One two. Three four."),
        (150.0, 0.0, 150.0, "One two.", "Three four."),
        (260.0, 0.0, 260.0, "One two. Three", "four."),
        (9999.0, 0.0, 400.0, "One two. Three four.", ""),  # never beyond what was sent
        (1150.0, 1000.0, 150.0, "One two.", "Three four."),  # the utterance began at 1000
        (500.0, 1000.0, 0.0, "", "One two. Three four."),  # before it began
    ],
)
def test_cancel_report_table(
    position: float, offset: float, heard: float, spoken: str, unspoken: str
) -> None:
    utt = _utterance(("One two.", 0, 200, True), ("Three four.", 200, 200, False))
    utt.flow_offset_ms = offset
    assert heard_position(utt, position) == heard
    messages = cancel_report("ctx", [utt], position, "played_ms")
    assert [type(m) for m in messages] == [protocol.AudioCancelled, protocol.SessionDone]
    cancelled = messages[0]
    assert isinstance(cancelled, protocol.AudioCancelled)
    assert (cancelled.spoken_text, cancelled.unspoken_text) == (spoken, unspoken)
    assert cancelled.played_ms == heard and cancelled.sent_ms == 400
    assert cancelled.position_source == "played_ms" and cancelled.context_id == "ctx"


def test_cancel_report_closes_the_open_sentence_of_its_utterance() -> None:
    first = _utterance(("One two.", 0, 200, True))
    second = _utterance(("Three four.", 0, 120, False))
    second.unsent_text = "five six"
    open_sentence = second.segments[0]
    messages = cancel_report(None, [first, second], 50.0, "estimate", open_sentence, 999)
    kinds = [type(m) for m in messages]
    assert kinds == [
        protocol.AudioCancelled,
        protocol.SessionDone,
        protocol.AudioCancelled,
        protocol.AudioDone,
        protocol.SessionDone,
    ]
    done = messages[3]
    assert isinstance(done, protocol.AudioDone)
    assert (done.total_bytes, done.audio_ms, done.cancelled) == (999, 120, True)
    assert messages[2].unspoken_text.endswith("five six")  # type: ignore[union-attr]
    assert open_sentence.audio.audio_ms == 120  # the report changes nothing


# --- contexts -----------------------------------------------------------------------


async def test_contexts_are_limited_and_numbered() -> None:
    h = Harness(max_contexts=2)
    try:
        h.handle(CONFIG)
        assert h.handle(protocol.InputText(text="a", context_id="a")) == []
        assert h.handle(protocol.InputText(text="b", context_id="b")) == []
        error = _error(h.handle(protocol.InputText(text="c", context_id="c")))
        assert error.code == ErrorCode.INVALID_STATE and "limit 2" in error.message
        numbers = [c.number for c in h.session.contexts]
        assert numbers == [1, 2]
        actions = h.handle(protocol.Cancel(context_id="*"))
        assert [a.context_id for a in actions if isinstance(a, protocol.AudioCancelled)] == [
            "a",
            "b",
        ]
        assert h.handle(protocol.InputText(text="c", context_id="c")) == []  # room again
    finally:
        await h.session.shutdown()


# --- voice requests, errors, lifecycle ---------------------------------------------


async def test_voice_requests_go_to_the_route(h: Harness, tmp_path: Path) -> None:
    request = protocol.VoiceList(request_id="r1")
    assert h.handle(request) == [AnswerVoiceRequest(request)]
    store = VoiceStore(tmp_path)
    await asyncio.to_thread(store.open)
    try:
        desk = VoiceDesk(h.engine, h.settings, store)
        result = await desk.answer(request)
        assert isinstance(result, protocol.VoiceListResult) and result.request_id == "r1"
        assert any(v["name"] == "tone" for v in result.voices)
        resolved = await desk.resolve_config_voices(protocol.SessionConfig(voice="TONE"))
        assert resolved.voice == "TONE"  # an engine voice is left for the validator
    finally:
        await asyncio.to_thread(store.close)


async def test_ping_close_and_errors(h: Harness) -> None:
    assert h.handle(protocol.Ping(id=7)) == [protocol.Pong(id=7)]
    # protocol 2.0.0: the close waits for what was flushed (none here)
    assert h.handle(protocol.SessionClose()) == [CloseWhenDone(CloseCode.NORMAL, "session.close")]
    assert h.handle(protocol.SessionClose()) == []  # the first close decides
    refused = h.session.report_error(
        GatewayError(ErrorCode.UNKNOWN_VOICE, "no"),
        request_id="x",
        may_be_fatal=False,
    )
    assert _types(refused) == [protocol.Error] and refused[0].request_id == "x"
    assert h.session.begin_close() == []
    assert h.session.state is State.CLOSING
    assert h.session.begin_close() is None  # closing once


async def test_drain_cancels_open_utterances_and_refuses_new_ones(h: Harness) -> None:
    h.handle(CONFIG)
    h.handle(protocol.InputText(text="still typing", context_id="a"))
    actions = h.session.begin_drain()
    assert _types(actions) == [protocol.AudioCancelled, protocol.SessionDone]
    error = _error(h.handle(protocol.InputText(text="more", context_id="b")))
    assert error.code == ErrorCode.BUSY


async def test_close_speaks_what_was_committed_and_reports_the_rest_unspoken(
    h: Harness,
) -> None:
    """session.close (2.0.0): an utterance with input.done is spoken whole;
    an open one speaks what input.flush committed, then reports the text
    never flushed as unspoken; no new utterance starts."""
    h.handle(CONFIG)
    h.handle(protocol.InputText(text="Finished one. Finished two.", context_id="done"))
    h.handle(protocol.InputDone(context_id="done"))
    h.handle(protocol.InputText(text="flushed part", context_id="open"))
    h.handle(protocol.InputFlush(context_id="open"))
    h.handle(protocol.InputText(text=" never flushed", context_id="open"))
    actions = h.handle(protocol.SessionClose())
    assert actions == [CloseWhenDone(CloseCode.NORMAL, "session.close")]  # audio in flight
    assert h.session.busy()
    refused = _error(h.handle(protocol.InputText(text="too late", context_id="open")))
    assert refused.code == ErrorCode.INVALID_STATE and not refused.fatal
    assert "session.close" in refused.message
    await h.out.wait_for(protocol.SessionDone, 2)
    done = {e.context_id: e for e in h.out.events if isinstance(e, protocol.SessionDone)}
    assert not done["done"].cancelled and done["done"].total_sentences == 2
    assert done["open"].cancelled and done["open"].total_sentences == 1
    (report,) = [e for e in h.out.events if isinstance(e, protocol.AudioCancelled)]
    assert report.context_id == "open" and report.position_source == "sent_ms"
    assert report.spoken_text == "flushed part" and report.unspoken_text == "never flushed"
    assert report.played_ms == report.sent_ms > 0
    started = [e.sentence_text for e in h.out.events if isinstance(e, protocol.AudioStart)]
    assert sorted(started) == ["Finished one.", "Finished two.", "flushed part"]
    assert not h.session.busy() and not h.session.speaking()
    assert h.admission.active == 1  # until the session ends (the connection closes)


async def test_close_reports_text_never_flushed_at_once(h: Harness) -> None:
    h.handle(CONFIG)
    h.handle(protocol.InputText(text="still typing"))
    actions = h.handle(protocol.SessionClose())
    assert _types(actions) == [protocol.AudioCancelled, protocol.SessionDone, CloseWhenDone]
    assert actions[0].unspoken_text == "still typing" and actions[0].spoken_text == ""
    assert actions[1].cancelled and not h.session.busy()


def test_every_client_message_is_dispatched() -> None:
    """``handle`` ends in ``assert_never``: mypy proves the match exhaustive;
    this checks that each message class has a case of its own."""
    import inspect

    from gateway.session import core as session

    source = inspect.getsource(session.Session._dispatch)
    for cls in protocol.CLIENT_MESSAGES:
        assert f"protocol.{cls.__name__}(" in source, cls


@pytest.mark.parametrize(
    ("text", "words", "position", "spoken", "unspoken"),
    [
        # verbatim words: punctuation stays glued to the word
        ("Hi, you there.", ["Hi", "you", "there"], 150.0, "Hi, you", "there."),
        # normalised words (not in the text): whitespace tokens, same count
        (
            "It costs 42 euros.",
            ["It", "costs", "forty-two", "euros"],
            250.0,
            "It costs 42",
            "euros.",
        ),
        # different counts: proportional
        ("Pay 42 now.", ["Pay", "forty", "two", "now"], 250.0, "Pay 42", "now."),
        ("Pay 42 now.", ["Pay", "forty", "two", "now"], 0.0, "", "Pay 42 now."),
        ("Pay 42 now.", ["Pay", "forty", "two", "now"], 999.0, "Pay 42 now.", ""),
    ],
)
def test_heard_split_falls_back_to_whitespace_tokens(
    text: str, words: list[str], position: float, spoken: str, unspoken: str
) -> None:
    utt = Utterance(index=0, config=protocol.EffectiveConfig(**_DEFAULTS))
    sentence = utt.add_segment(text).audio
    sentence.started = True
    sentence.words = tuple(WordTiming(w, i * 100.0, (i + 1) * 100.0) for i, w in enumerate(words))
    assert utt.heard_split(position, "") == (spoken, unspoken)


def test_heard_split_is_a_prefix_a_silent_segment_after_a_half_heard_one_is_unspoken() -> None:
    """Issue 28: a cancel during Markdown reference definitions reported the
    silent segments after a half-heard one as spoken, out of order."""
    utt = Utterance(index=0, config=protocol.EffectiveConfig(**_DEFAULTS))
    # the words cover the start only: the rest of the text was silent markup
    heard = utt.add_segment("See this. [r1]: https://e.co/1").audio
    heard.started, heard.finished, heard.start_ms, heard.audio_ms = True, True, 0.0, 200.0
    heard.words = (WordTiming("See", 0.0, 100.0), WordTiming("this.", 100.0, 200.0))
    silent = utt.add_segment("[r2]: https://e.co/2").audio
    silent.started, silent.finished, silent.start_ms, silent.audio_ms = True, True, 200.0, 0.0
    assert utt.heard_split(999.0, "") == (
        "See this.",
        "[r1]: https://e.co/1 [r2]: https://e.co/2",
    )


# --- what the audio stream writes: the ledger, and the events it builds from it --------


def _reported(h: Harness, text: str = "One two.") -> QueuedSegment:
    """A segment of an open utterance, as the core would hand it to a stream."""
    h.handle(protocol.InputText(text="not yet", context_id="c"))  # opens the utterance
    ctx = h.session.contexts.get("c")
    assert ctx is not None and ctx.utterance is not None
    return QueuedSegment(ctx, ctx.utterance, ctx.utterance.add_segment(text))


def _start(item: QueuedSegment) -> list[protocol.ServerMessage]:
    """What the stream does as a segment's audio begins."""
    item.utterance.audio.start_segment(item.segment.audio)
    return segment_events.audio_start(item.context, item.utterance, item.segment)


def _frame_sent(item: QueuedSegment, payload: bytes, samples: int) -> None:
    """What the stream writes for one message of audio it sent."""
    ctx, utt = item.context, item.utterance
    tagged = utt.config.framing == "tagged"
    ctx.audio.message_sent(item.segment.audio, payload, numbered=tagged)
    utt.audio.count_sent(item.segment.audio, samples, utt.config.sample_rate, 1.0)


def _finish(item: QueuedSegment, failure: GatewayError | None) -> list[protocol.ServerMessage]:
    utt = item.utterance
    utt.audio.finish_segment(item.segment.audio, utt.config.sample_rate)
    return segment_events.audio_done(item.context, utt, item.segment, failure)


async def test_the_ledger_holds_what_the_stream_sent(h: Harness) -> None:
    h.handle(protocol.SessionConfig(**{**_STREAMED, "framing": "tagged", "timestamps": True}))
    first = _reported(h)
    utt, ctx = first.utterance, first.context
    (start,) = _start(first)
    assert isinstance(start, protocol.AudioStart)
    assert (start.context_id, start.sentence_index, start.sentence_text) == ("c", 0, "One two.")
    assert start.context_number == ctx.number and start.sample_rate == 22050
    assert first.segment.audio.started and first.segment.audio.start_ms == 0
    for _ in range(10):  # 10 frames of 20 ms at 22050 Hz
        _frame_sent(first, bytes(882), 441)
    assert utt.audio.sent_ms == pytest.approx(200) and ctx.audio.sequence == 10
    assert utt.audio.first_audio_at is not None
    assert (first.segment.audio.first_sequence, first.segment.audio.messages) == (0, 10)
    utt.audio.account(SegmentStats(queue_ms=5.0, compute_ms=30.0))
    (done,) = _finish(first, None)
    assert isinstance(done, protocol.AudioDone) and not done.error and done.total_bytes == 8820
    assert first.segment.audio.finished and first.segment.audio.audio_ms == pytest.approx(200)
    # the next segment starts where the utterance is: alignment in utterance time
    second = QueuedSegment(ctx, utt, utt.add_segment("Three."))
    _start(second)
    assert second.segment.audio.start_ms == pytest.approx(200)
    assert second.segment.audio.start_sample == 4410
    words = (WordTiming("Three", 0.0, 150.0),)
    mapped = second.segment.audio.add_words(words, second.segment.spoken_form)
    (alignment,) = segment_events.alignment(ctx, utt, second.segment, mapped)
    assert isinstance(alignment, protocol.Alignment) and alignment.sentence_index == 1
    assert (alignment.words[0].start_ms, alignment.words[0].end_ms) == (200.0, 350.0)
    assert second.segment.audio.words == words
    _frame_sent(second, bytes(2), 1)
    assert second.segment.audio.first_sequence == 10  # the context's count goes on
    utt.audio.account(SegmentStats(queue_ms=9.0, compute_ms=20.0))
    # the first queue time, all compute
    assert (utt.audio.queue_ms, utt.audio.compute_ms) == (5.0, 50.0)


_STREAMED: dict[str, Any] = {"voice": "tone", "stream_audio": True, "response_format": "pcm"}


async def test_raw_frames_move_no_sequence_and_alignment_waits_for_timestamps(h: Harness) -> None:
    h.handle(protocol.SessionConfig(**_STREAMED))
    item = _reported(h)
    _start(item)
    _frame_sent(item, b"RIFF", 0)  # a WAV header: no audio
    assert item.utterance.audio.first_audio_at is None
    _frame_sent(item, bytes(882), 441)
    assert item.context.audio.sequence == 0 and item.utterance.audio.sent_ms == pytest.approx(20)
    assert item.segment.audio.first_sequence is None
    mapped = item.segment.audio.add_words((WordTiming("One", 0.0, 10.0),), item.segment.spoken_form)
    assert segment_events.alignment(item.context, item.utterance, item.segment, mapped) == []
    assert item.segment.audio.words is not None  # kept for the cancel report all the same


def test_audio_chunk_events_take_no_sequence_number() -> None:
    """vllm-omni 0.30's JSON audio.chunk frames are not binary messages: the
    binary sequence numbers skip them, under any framing."""
    ctx = ContextAudio(sequence=5)
    segment = SegmentAudio()
    ctx.message_sent(segment, bytes(10), numbered=False)
    assert ctx.sequence == 5 and segment.first_sequence is None
    assert (segment.messages, segment.sent_bytes) == (1, 10)


@pytest.mark.parametrize(
    ("failure", "sent_bytes", "partial"),
    [
        (GatewayError(ErrorCode.ENGINE_REFUSED, "the engine refused sentence 0: no"), 0, False),
        (GatewayError(ErrorCode.INTERNAL, "synthesis of sentence 0 failed: boom"), 882, True),
    ],
)
async def test_a_failed_segment_is_an_error_beside_its_audio_done(
    h: Harness, failure: GatewayError, sent_bytes: int, partial: bool
) -> None:
    h.handle(protocol.SessionConfig(**_STREAMED))
    item = _reported(h)
    _start(item)
    if sent_bytes:
        _frame_sent(item, bytes(sent_bytes), sent_bytes // 2)
    error, done = _finish(item, failure)
    assert isinstance(error, protocol.Error) and isinstance(done, protocol.AudioDone)
    assert (error.code, error.message, error.context_id) == (failure.code, failure.message, "c")
    # vllm-omni 0.30's "discard" once part of the sentence's audio went out
    assert error.action == ("discard" if partial else "sentence_skipped")
    assert error.partial_audio is partial
    assert not error.fatal and done.error and done.total_bytes == sent_bytes


class CountingHost:
    """Stands between a session's streams and its core: counts every call a
    stream makes into the core (any attribute it calls, not only those
    ``StreamHost`` declares), with the number of frames sent before it."""

    def __init__(self, core: Endings, out: RecordingSender) -> None:
        self._core = core
        self._out = out
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._core, name)
        if not callable(attribute):
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, self._out.frames))
            return attribute(*args, **kwargs)

        return counted


@pytest.mark.parametrize("flow_control", ["none", "realtime"])
async def test_a_frame_costs_no_call_from_the_stream_into_the_core(flow_control: str) -> None:
    """The per-frame accounting stays in the stream (the ledger, the
    listener): the core hears of a segment once it left the queue, and of
    nothing per frame."""
    h = Harness()
    session = h.session
    counting = CountingHost(session.endings, h.out)
    env = dataclasses.replace(session.audio_streams.env, host=counting)
    session.audio_streams = SessionStreams(env)
    try:
        h.handle(
            protocol.SessionConfig(
                **{**_STREAMED, "framing": "tagged", "flow_control": flow_control}
            )
        )
        h.handle(protocol.InputText(text="One sentence to speak. And a second one here."))
        h.handle(protocol.InputDone())
        await h.out.wait_for(protocol.SessionDone)
    finally:
        await session.shutdown()
    (ctx,) = session.contexts
    segments = sum(isinstance(e, protocol.AudioDone) for e in h.out.events)
    assert segments == 2 and h.out.frames > 20 * segments
    assert ctx.audio.sequence == h.out.frames  # every frame is in the ledger
    # per segment, the stream asks for the cancel reports (none) and reports
    # it left the queue: never between two frames of a segment
    assert [name for name, _ in counting.calls] == [
        "cancelled_audio_ended",
        "segment_dequeued",
    ] * segments
    frames_at_calls = {frames for _, frames in counting.calls}
    assert len(frames_at_calls) == segments  # both calls of a segment after its last frame


async def _spoken_by_faulty_engine(text: str) -> list[Any]:
    """What a session sends for one utterance of ``text`` on ``FaultyEngine``."""
    h = Harness(engine=FaultyEngine)
    try:
        h.handle(CONFIG)
        h.handle(protocol.InputText(text=text))
        h.handle(protocol.InputDone())
        await h.out.wait_for(protocol.SessionDone)
        return list(h.out.events)
    finally:
        await h.session.shutdown()


async def test_an_engine_refusal_reaches_the_client_with_the_engine_code() -> None:
    events = await _spoken_by_faulty_engine("Please refuse this. Then speak this.")
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "AudioStart",
        "Error",
        "AudioDone",
        "AudioStart",
        "AudioDone",
        "SessionDone",
    ]
    error = events[1]
    assert isinstance(error, protocol.Error) and error.code == ErrorCode.ENGINE_REFUSED
    assert "the reference audio cannot be read" in error.message
    assert events[2].error is True
    done = events[-1]
    assert isinstance(done, protocol.SessionDone) and done.total_sentences == 2


async def test_a_models_exception_text_never_reaches_the_client() -> None:
    """A model that raises mid-segment: the client hears which segment failed
    and the exception's type, never its text (paths, addresses)."""
    events = await _spoken_by_faulty_engine("Now crash here. Then speak this.")
    (error,) = [e for e in events if isinstance(e, protocol.Error)]
    assert error.code == ErrorCode.INTERNAL and "RuntimeError" in error.message
    assert CRASH_TEXT not in error.message and "/srv" not in error.message
    done = events[-1]
    assert isinstance(done, protocol.SessionDone) and done.total_sentences == 2
