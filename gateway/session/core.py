"""The session core: one WebSocket session's state machine, without I/O.

``Session.handle`` takes one decoded client message and returns the
*actions* that follow from it: server messages to send, a ``Close`` of the
connection, or an ``AnswerVoiceRequest`` for the route to answer (the voice
store does I/O).  The route (``gateway.ws.endpoint``) performs them; the
core never awaits a send, so its logic is tested without a server
(``tests/session/test_session_core.py``).

Audio is the exception by design: the core hands each speakable segment to
an ``AudioStream`` (``gateway.session.audio_stream``), whose task submits it to the
engine and writes the frames through the session's one bounded sender
(``gateway.ws.outbound.Outbound``), in order with the events about them.  The
core writes the text side of the contexts, utterances and segments; the
stream alone writes their audio side, the ledger (``gateway.session.ledger``),
which the core reads for cancel reports, ``session.done`` and the audio
ahead of the listener.  A stream reports only the session-wide events
(``StreamHost``: a segment left its queue, cancelled audio stopped, a
listener went silent, the connection is gone); the core updates its state
and answers with the messages the stream sends.  To stop a stream's work
the core asks the stream (``AudioStream.cancel``).

The reader never waits on synthesis: ``cancel`` and ``playback`` are
handled while audio is being produced.

Admission (``gateway.flow.admission``): a session is admitted once, at its
first committed text, and keeps its admission until it ends: none of its
utterances is refused or cut for capacity afterwards.  Until the door lets
it in, its committed segments wait here (``_waiting``) and more text is
accepted meanwhile.  The gate's decision is an event the endpoint delivers
(``slot_event``): a grant hands the waiting segments to the streams; a
refusal past the deadline answers ``busy`` with ``retry_after_ms`` before
any audio and reports the text as not spoken (``audio.cancelled``,
``session.done`` ``cancelled``).

Lifecycle: ``OPEN`` (after ``session.created``) -> ``CLOSING`` (close,
error or disconnect: work is being cancelled) -> ``CLOSED``.  An illegal
transition raises at once.  ``session.close`` (since protocol 2.0.0) first
*finishes* while still ``OPEN`` (``begin_drain(closing=True)``, the same
drain as a server shutdown's): no new utterance starts, what was committed is
spoken, and the route closes once nothing is left or ``drain_timeout_s``
passed (``CloseWhenDone``); ``cancel`` and ``playback`` are read meanwhile.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, assert_never

from gateway import protocol
from gateway.engines.base import Engine
from gateway.errors import CloseCode, ErrorCode, GatewayError
from gateway.flow.admission import AdmissionGate, Ticket
from gateway.flow.budget import DecodeBudget
from gateway.session.audio_stream import AudioStream, QueuedSegment, Sender, StreamEnv
from gateway.session.cancel_report import cancel_report
from gateway.session.capabilities import capabilities_message
from gateway.session.config import apply_config, clone_options, default_config
from gateway.session.contexts import Context, Contexts
from gateway.session.utterance import Segment, Utterance
from gateway.session.voice_requests import VoiceRequest
from gateway.text.duration import estimate_seconds
from gateway.text.frontend import FrontEnd, FrontEndError
from gateway.text.frontend.lexicon import MAX_SPOKEN_CHARS
from gateway.text.policy import LOAD_ALLOWANCE_S, PolicyConfig, SegmentPolicy
from gateway.text.segmenter import Segmenter
from gateway.text.stage import EngineTextBudget, Lexicon, frontend_options

if TYPE_CHECKING:
    from gateway.ops.metrics import Metrics
    from gateway.settings import Settings

log = logging.getLogger(__name__)


class SessionLog(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every record with the session id (never the spoken text)."""

    def process(self, msg: object, kwargs: MutableMapping[str, Any]) -> tuple[object, Any]:
        extra = self.extra or {}
        return f"[session={extra.get('session')}] {msg}", kwargs


class State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True)
class Close:
    """Close the connection (after cancelling and reporting its work)."""

    code: int
    reason: str


@dataclass(frozen=True)
class AnswerVoiceRequest:
    """A ``voice.*`` request for the route to answer (``gateway.session.voice_requests``)."""

    request: VoiceRequest


@dataclass(frozen=True)
class CloseWhenDone:
    """``session.close``: close with ``code`` once the session has nothing
    left to speak (``busy`` is false), or after ``drain_timeout_s``
    (``Close`` then cancels and reports the rest); keep reading meanwhile."""

    code: int
    reason: str


Action = protocol.ServerMessage | Close | CloseWhenDone | AnswerVoiceRequest


def _unclosed_error(context_id: str | None, problem: FrontEndError) -> protocol.Error:
    return protocol.Error(
        code=ErrorCode.INVALID_SSML,
        message=f"{problem.message} (at character {problem.position} of the utterance's text)",
        context_id=context_id,
    )


#: segments up to this length are read by the front-end on the event loop
#: (worst case about 3 ms of CPU for adversarial text; typical 0.1 ms)
INLINE_READ_CHARS = 200


async def _read_after(
    before: asyncio.Future[None] | None, call: Callable[[Segment], None], segment: Segment
) -> None:
    if before is not None:
        await asyncio.wait({before})
    try:
        await asyncio.to_thread(call, segment)
    except Exception:  # a front-end bug must not stop the session
        log.exception("the text front-end failed; the segment is read as written")


async def _finish_after(before: asyncio.Future[None], utterance: Utterance) -> None:
    await asyncio.wait({before})
    utterance.finish_reading()


class Session:
    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        metrics: Metrics,
        admission: AdmissionGate,
        out: Sender,
        *,
        client: str = "local",
        lexicon: Lexicon = (),
    ) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.admission = admission
        #: the server's pronunciation lexicon (``lexicon_file``)
        self.lexicon = lexicon
        #: whom admission's fairness counts this session as (address or agent key)
        self.client = client
        #: the session's admission (``_take_slot``): waiting at the door or granted
        self._door: Ticket | None = None
        #: the most utterances of this session streaming at once (``max_streams_per_session``)
        self._share = settings.max_streams_per_session
        #: utterances streaming (committed text being synthesized, queued or sent)
        self._holding: set[Utterance] = set()
        #: utterances committed and waiting (for the door, or for the session's
        #: share): their context and segments, in commit order
        self._waiting: dict[Utterance, tuple[Context, list[QueuedSegment]]] = {}
        #: the endpoint's delivery of a slot decision (``Connection.slot_decided``);
        #: it calls ``slot_event`` and performs the actions.  None: applied here,
        #: messages dropped (core tests without an endpoint)
        self.slot_listener: Callable[[Ticket], None] | None = None
        #: decoded but unsent audio the session's engine jobs may hold
        self.budget = DecodeBudget(settings.max_buffered_ms / 1000)
        self.state = State.OPEN
        self.config = default_config(engine.default_voice(), engine.name)
        self.config_accepted = False
        #: voice-clone fields in force (``session_config.clone_options``), for
        #: an engine declaring ``cloning``; not echoed (``ref_audio`` may be large)
        self.clone_options: Mapping[str, object] = {}
        #: the server is shutting down: no new utterance starts
        self.draining = False
        #: ``session.close`` was received: no new utterance starts, the
        #: committed text is being spoken before the close
        self.closing = False
        self.contexts = Contexts(settings.max_contexts, self._context_live)
        self.utterances_started = 0
        self.log = SessionLog(log, {"session": self.id})
        # the core never sends: it hands the sender to its audio streams
        self._stream_env = StreamEnv(
            engine=engine,
            voice_rates={v.name: v.sample_rate for v in engine.voices()},
            budget=self.budget,
            out=out,
            label=self.id,
            log=self.log,
            host=self,
            metrics=metrics,
        )
        self.shared_stream = AudioStream(self._stream_env, "shared")
        #: a context's own stream under tagged framing
        self._context_streams: dict[Context, AudioStream] = {}

    # ------------------------------------------------------------------
    # state
    # ------------------------------------------------------------------
    def _transition(self, new: State) -> None:
        allowed = {
            State.OPEN: {State.CLOSING, State.CLOSED},
            State.CLOSING: {State.CLOSED},
            State.CLOSED: set(),
        }
        if new not in allowed[self.state]:
            raise RuntimeError(f"illegal session transition {self.state} -> {new}")
        self.state = new

    def limits(self) -> protocol.Limits:
        s = self.settings
        capabilities = self.engine.capabilities
        return protocol.Limits(
            max_message_bytes=s.max_message_bytes,
            max_input_text_bytes=s.max_input_text_bytes,
            max_utterance_chars=s.max_utterance_chars,
            max_contexts=s.max_contexts,
            max_buffered_ms=s.max_buffered_ms,
            config_timeout_s=s.config_timeout_s,
            idle_timeout_s=s.idle_timeout_s,
            stall_timeout_s=s.stall_timeout_s,
            max_utterance_engine_chars=s.engine_chars_budget,
            max_segment_chars=s.max_segment_chars,
            max_pronunciation_chars=MAX_SPOKEN_CHARS,
            max_work_item=capabilities.max_work_item or None,
            work_item_unit=capabilities.work_item_unit or None,
        )

    def created_message(self) -> protocol.SessionCreated:
        return protocol.SessionCreated(
            session_id=self.id,
            protocol_version=protocol.PROTOCOL_VERSION,
            engine=self.engine.name,
            voices=[
                protocol.VoiceDescription(
                    name=v.name,
                    language=v.language,
                    language_name=v.language_name,
                    sample_rate=v.sample_rate,
                    quality=v.quality,
                    streaming=v.streaming,
                )
                for v in self.engine.voices()
            ],
            defaults=self.config,
            limits=self.limits(),
            capabilities=capabilities_message(self.engine.capabilities),
        )

    def busy(self) -> bool:
        """Any utterance in progress, text buffered, segments queued or audio unsent."""
        return any(self._context_live(c) for c in self.contexts)

    def producing(self) -> bool:
        """Audio being synthesized, queued or sent (the idle timer waits for
        it).  Text waiting in the segmenter for more input does not count: a
        client that sends half a sentence and goes quiet is idle, and the
        idle close reports that text as unspoken."""
        return any(ctx.pending or self._has_work(ctx) for ctx in self.contexts)

    def _context_live(self, ctx: Context) -> bool:
        return bool(
            ctx.utterance is not None
            or ctx.pending
            or ctx.policy.buffered.strip()
            or self._has_work(ctx)
        )

    def _has_work(self, ctx: Context) -> bool:
        """Segments of ``ctx`` spoken, queued or waiting for a slot."""
        return self._stream_for(ctx).has_work_for(ctx) or any(
            c is ctx for c, _ in self._waiting.values()
        )

    def _has_work_for(self, utt: Utterance, ctx: Context) -> bool:
        return utt in self._waiting or self._stream_for(ctx).has_work_for_utterance(utt)

    def streams(self) -> list[AudioStream]:
        return [self.shared_stream, *self._context_streams.values()]

    # ------------------------------------------------------------------
    # messages
    # ------------------------------------------------------------------
    def handle(self, message: protocol.ClientMessage) -> list[Action]:
        """Handle one decoded message; returns what to send or do, in order.

        A refused message returns its ``error`` (and a ``Close`` if fatal)."""
        try:
            return self._dispatch(message)
        except GatewayError as error:
            return self.report_error(error, getattr(message, "context_id", None))

    def _dispatch(self, message: protocol.ClientMessage) -> list[Action]:
        match message:
            case protocol.SessionConfig():
                return self._on_config(message)
            case protocol.InputText(text=text, context_id=cid):
                self._on_text(cid, text)
                return []
            case protocol.InputFlush(context_id=cid):
                self._on_flush(cid, done=False)
                return []
            case protocol.InputDone(context_id=cid):
                return self._on_done(cid)
            case protocol.Cancel(context_id=cid):
                return self.cancel(cid)
            case protocol.Playback(played_ms=played, context_id=cid):
                self._on_playback(cid, played)
                return []
            case protocol.Ping(id=ping_id):
                return [protocol.Pong(id=ping_id)]
            case protocol.SessionClose():
                if self.closing:
                    return []  # already finishing: the first close decides
                return [
                    *self.begin_drain(closing=True),
                    CloseWhenDone(CloseCode.NORMAL, "session.close"),
                ]
            case protocol.VoiceList() | protocol.VoiceAdd() | protocol.VoiceRemove():
                return [AnswerVoiceRequest(message)]
            case _:
                assert_never(message)

    def report_error(
        self,
        error: GatewayError,
        context_id: str | None = None,
        *,
        request_id: protocol.RequestId = None,
        may_be_fatal: bool = True,
    ) -> list[Action]:
        """The ``error`` event for ``error``, then a ``Close`` if it is fatal.

        ``may_be_fatal=False`` (a refused ``voice.*`` request) keeps the
        session open whatever the code's registry rule."""
        spec = error.code.spec
        fatal = may_be_fatal and (
            spec.fatal == "always" or (spec.fatal == "first_config" and not self.config_accepted)
        )
        self.log.info("error %s: %s", error.code, error.message)
        actions: list[Action] = [
            protocol.Error(
                code=error.code,
                message=error.message,
                fatal=fatal,
                context_id=context_id,
                request_id=request_id,
                retry_after_ms=(
                    None if error.retry_after_s is None else round(error.retry_after_s * 1000)
                ),
                waited_ms=None if error.waited_s is None else round(error.waited_s * 1000),
            )
        ]
        if fatal:
            actions.append(Close(spec.close_code or CloseCode.POLICY, str(error.code)))
        return actions

    def _on_config(self, message: protocol.SessionConfig) -> list[Action]:
        """``message`` has its voice names resolved (``VoiceDesk.resolve_config_voices``)."""
        engine = self.engine
        caps = engine.capabilities
        new = apply_config(
            self.config,
            message,
            engine.voices(),
            engine.name,
            engine.model_names(),
            instructions=caps.instructions,
            cloning=caps.cloning,
            seed=caps.seed,
            alignment=caps.alignment,
            speed=caps.speed,
        )
        options = clone_options(self.clone_options, message, caps.cloning)
        if self.busy() and (new.framing != self.config.framing):
            raise GatewayError(
                ErrorCode.INVALID_STATE,
                "`framing` cannot change while an utterance is in progress;"
                " send it before the next utterance",
                param="framing",
            )
        self.config = new
        self.clone_options = options
        self.config_accepted = True
        return [protocol.SessionUpdated(config=new, limits=self.limits())]

    def _context(self, cid: str | None) -> Context:
        ctx, forgotten = self.contexts.get_or_create(cid, self._new_policy)
        for old in forgotten:
            stream = self._context_streams.pop(old, None)
            if stream is not None:
                stream.discard()
        return ctx

    # --- segmentation policy (docs/segmentation.md) ---------------------
    def _new_policy(self, segmenter: Segmenter | None = None) -> SegmentPolicy:
        session = self.config
        if (
            segmenter is None
            or segmenter.granularity != session.split_granularity
            or segmenter.input_format != session.input_format
            or segmenter.markup_tags != self.engine.capabilities.markup_tags
        ):
            # cuts keep the input format's constructs and the engine's tags whole
            segmenter = Segmenter(
                session.split_granularity,
                max_chars=self.settings.max_segment_chars,
                input_format=session.input_format,
                markup_tags=self.engine.capabilities.markup_tags,
            )
        config = PolicyConfig(
            # the engine's own time to first chunk, with room for load
            lead_s=self.engine.capabilities.typical_first_chunk_s + LOAD_ALLOWANCE_S,
            first_min_words=self.settings.first_segment_min_words,
            min_words=self.settings.phrase_min_words,
            speed=self.config.speed,
        )
        # one WAV per segment without streamed audio: no early cuts there
        return SegmentPolicy(segmenter, config, timed=self.config.stream_audio)

    def _ahead_s(self, ctx: Context, now: float) -> float:
        """Audio ahead of the context's listener: sent and unplayed, plus the
        estimated rest of every segment committed and not yet fully sent."""
        ahead = ctx.listener.ahead_s(now)
        for utt in ctx.open_utterances():
            for segment in utt.segments:
                if segment.audio.finished or utt.cancelled:
                    continue
                estimate = estimate_seconds(segment.engine_text, utt.config.speed)
                audio = segment.audio
                sent = (utt.audio.sent_ms - audio.start_ms) / 1000 if audio.started else 0.0
                ahead += max(0.0, estimate - sent)
        return ahead

    def _arm_segment_timer(self, ctx: Context, now: float, ahead: float) -> None:
        ctx.cancel_segment_timer()
        at = ctx.policy.next_check(now, ahead) if ctx.utterance is not None else None
        if at is not None:
            loop = asyncio.get_running_loop()
            ctx.segment_timer = loop.call_later(max(0.0, at - now), self._segment_fire, ctx)

    def _segment_fire(self, ctx: Context) -> None:
        ctx.segment_timer = None
        if self.state is State.OPEN and ctx.utterance is not None:
            now = time.monotonic()
            ahead = self._ahead_s(ctx, now)
            # an early cut commits text: without a slot for it, the text
            # waits in the segmenter (for more text, a flush or a free slot)
            if self._slot_refusal() is None:
                self._enqueue(ctx, [c.text for c in ctx.policy.poll(now, ahead)])
            self._arm_segment_timer(ctx, now, self._ahead_s(ctx, now))

    def _on_text(self, cid: str | None, text: str) -> None:
        if len(text.encode("utf-8", "surrogatepass")) > self.settings.max_input_text_bytes:
            raise GatewayError(
                ErrorCode.TEXT_TOO_LONG,
                f"input.text is over {self.settings.max_input_text_bytes} bytes; send it in"
                " smaller increments",
            )
        ctx = self._context(cid)
        utt = ctx.utterance
        self._check_slot("this text was not accepted")
        if utt is None:
            utt = self._start_utterance(ctx)
        if utt.accepted_chars + len(text) > self.settings.max_utterance_chars:
            raise GatewayError(
                ErrorCode.TEXT_TOO_LONG,
                f"the utterance would exceed {self.settings.max_utterance_chars} characters;"
                " end it with input.done and start another",
            )
        utt.accepted_chars += len(text)
        utt.source_text += text
        now = time.monotonic()
        cuts = ctx.policy.push(text, now, self._ahead_s(ctx, now))
        self._enqueue(ctx, [c.text for c in cuts])
        self._arm_segment_timer(ctx, now, self._ahead_s(ctx, now))

    def _start_utterance(self, ctx: Context) -> Utterance:
        if self.closing:
            raise GatewayError(
                ErrorCode.INVALID_STATE,
                "session.close was received: the session is finishing what was flushed"
                " and then closes; this text was not accepted, open a new session for it",
            )
        if self.draining:
            raise GatewayError(
                ErrorCode.BUSY,
                "the server is shutting down; this text was not accepted,"
                " reconnect to another server",
            )
        ctx.policy = self._new_policy(ctx.policy.segmenter)
        ctx.listener.new_utterance()
        utt = Utterance(
            index=self.utterances_started,
            config=self.config,
            options=self.clone_options,
            first_text_at=time.monotonic(),
            frontend=self._new_frontend(),
            engine_budget=EngineTextBudget(self.settings.engine_chars_budget),
        )
        self.utterances_started += 1
        ctx.utterance = utt
        ctx.listener.configure(
            self.config.flow_control, self.config.max_lead_ms, self.settings.ack_timeout_s
        )
        utt.flow_offset_ms = ctx.listener.sent_ms
        self.metrics.utterances.inc()
        return utt

    def _new_frontend(self) -> FrontEnd:
        """The text front-end of an utterance starting now (``docs/text.md``)."""
        config = self.config
        return FrontEnd(
            frontend_options(
                input_format=config.input_format,
                normalize=config.normalize,
                emoji=config.emoji,
                pronunciations=config.pronunciations,
                language=config.language,
                capabilities=self.engine.capabilities,
                lexicon=self.lexicon,
            )
        )

    def _enqueue(self, ctx: Context, texts: list[str]) -> None:
        """Commit segments of the client's text: the front-end reads each
        (``_read``); it goes to the context's stream, or waits with its
        utterance for the door or the session's share."""
        utt = ctx.utterance
        if not texts or utt is None:
            return
        self._take_slot(ctx, utt)
        stream = self._stream_for(ctx)
        waiting = self._waiting.get(utt)
        for text in texts:
            segment = utt.add_segment(text)
            if utt.ready_at is None:
                utt.ready_at = time.monotonic()  # a slot wait counts in first_audio_ms
            item = QueuedSegment(ctx, utt, segment)
            self._read(item, stream)  # the front-end reads it, slot or not
            if waiting is not None:
                waiting[1].append(item)
            else:
                stream.enqueue(item)

    # --- the text front-end ----------------------------------------------------------
    # Reading a segment costs up to about 0.5 ms of CPU at p99 (0.7 ms measured
    # under load) and 7-9 ms for adversarial text of 500 characters
    # (docs/text.md); its passes are linear in the text.  A short segment
    # (at most INLINE_READ_CHARS, when no earlier read is pending) is read at
    # once on the loop: a worker-thread hop costs more than the reading and
    # delays the first audio (measured: +9 ms p50, +24 ms p95 of flush time to
    # first audio).  A longer one runs in a worker thread, one call at a time
    # per utterance (its FrontEnd carries state), chained in commit order; the
    # stream submits a segment to the engine only once it is read.
    def _read(self, item: QueuedSegment, stream: AudioStream) -> None:
        utt = item.utterance
        if utt.frontend is None:
            return
        idle = utt.reading is None or utt.reading.done()
        if idle and len(item.segment.text) <= INLINE_READ_CHARS:
            try:
                utt.read(item.segment)
            except Exception:  # a front-end bug must not stop the session
                log.exception("the text front-end failed; the segment is read as written")
            return
        item.read = utt.reading = asyncio.ensure_future(
            _read_after(utt.reading, utt.read, item.segment)
        )
        item.read.add_done_callback(lambda _: stream.read_done())

    def _finish_reading(self, utt: Utterance) -> None:
        """The utterance's text is complete (``input.done``): the front-end's
        end-of-text check runs after its last read (at once if none is left)."""
        pending = utt.reading
        if pending is None or pending.done():
            utt.finish_reading()  # a check of carried state: no parsing
            return
        utt.reading = asyncio.ensure_future(_finish_after(pending, utt))

    # --- admission: the door, then the session's share -------------------
    # A session is admitted once, at its first committed text (``_door``: a
    # ticket of the server's gate, ``max_active_streams`` counting admitted
    # sessions); it keeps its admission until it ends, so none of its
    # utterances, contexts or re-asks is ever refused or cut for capacity.
    # A session that finds the door closed waits in the gate's bounded queue
    # (its segments wait here, in ``_waiting``, and more text is accepted
    # meanwhile); past the deadline it is answered ``busy`` before any of its
    # audio.  Inside an admitted session, ``max_streams_per_session`` utterances
    # (all its contexts together) stream at once; more wait here for one of
    # the session's own to end: the share delays, never refuses.  An
    # utterance streams (``holds_slot``) while committed text of it is being
    # synthesized, queued or sent; text still in the segmenter holds nothing.
    @property
    def admitted(self) -> bool:
        return self._door is not None and self._door.state == "granted"

    def speaking(self) -> bool:
        """Some utterance of this session is streaming or waiting to (the
        capacity follower counts admitted sessions that speak)."""
        return bool(self._holding or self._waiting)

    def _slot_refusal(self) -> str | None:
        """Why a commit could not be admitted or wait at the door now (None: it can)."""
        if self._door is not None:
            return None
        return self.admission.refusal()

    def _check_slot(self, what: str) -> None:
        """Refuse (``busy``) text of a session that is not admitted when the
        door is closed and its queue full (or the server drains): that text
        could not be committed."""
        refusal = self._slot_refusal()
        if refusal is not None:
            raise self._busy(refusal, what)

    def _busy(self, refusal: str, what: str, waited_s: float | None = None) -> GatewayError:
        """The ``busy`` error of a ``refusal``; ``waited_s``: the time a
        refused session waited at the door first."""
        retry = self.admission.queue.retry_after_s
        if refusal == "draining":
            return GatewayError(
                ErrorCode.BUSY,
                f"the server is draining (shutting down); {what}, reconnect to another server",
                retry_after_s=retry,
                waited_s=waited_s,
            )
        if refusal == "deadline":
            return GatewayError(
                ErrorCode.BUSY,
                f"the server is full: no conversation ended within"
                f" {self.admission.queue.deadline_s:g} s (all {self.admission.limit} admitted"
                f" sessions are speaking); {what}, retry after retry_after_ms or connect to"
                " another server",
                retry_after_s=retry,
                waited_s=waited_s,
            )
        return GatewayError(
            ErrorCode.BUSY,
            f"the server is full ({self.admission.limit} sessions admitted) and its admission"
            f" queue is full; {what}, retry after retry_after_ms or connect to another server",
            retry_after_s=retry,
        )

    def _take_slot(self, ctx: Context, utt: Utterance) -> None:
        if utt.holds_slot or utt in self._waiting:
            return
        if self._door is None:
            ticket = self.admission.ask(self.client, self, notify=self._slot_decided)
            if ticket.state == "refused":
                # callers checked ``_slot_refusal`` first in the same call, so
                # this cannot happen; if it ever did, the work goes on
                # uncounted rather than losing text
                self.log.warning("committed text without admission")
                self._hold(utt)
                return
            self._door = ticket
        if self.admitted and len(self._holding) < self._share:
            self._hold(utt)
        else:
            self._waiting[utt] = (ctx, [])

    def _hold(self, utt: Utterance) -> None:
        utt.holds_slot = True
        self._holding.add(utt)

    def _slot_decided(self, ticket: Ticket) -> None:
        if self.slot_listener is not None:
            self.slot_listener(ticket)
        else:
            self.slot_event(ticket)

    def slot_event(self, ticket: Ticket) -> list[Action]:
        """The gate decided the session's waiting ticket: on a grant the
        waiting segments go to their streams; on a refusal (deadline,
        draining) every waiting utterance is answered ``busy`` and reported
        as not spoken (nothing of this session was spoken yet)."""
        if ticket is not self._door or self.state is not State.OPEN:
            return []  # withdrawn meanwhile (cancel, close): nothing waits for it
        if ticket.state == "granted":
            for utt in self._waiting:
                utt.admission_wait_ms = ticket.waited_s * 1000
            self._promote()
            return []
        self._door = None
        assert ticket.refusal is not None
        error = self._busy(ticket.refusal, "this utterance was not spoken", ticket.waited_s)
        actions: list[Action] = []
        refused: dict[Context, list[Utterance]] = {}
        for utt, (ctx, _) in list(self._waiting.items()):
            refused.setdefault(ctx, []).append(utt)
        self._waiting.clear()
        for ctx, utterances in refused.items():
            actions += self.report_error(error, ctx.id)
            actions += self._cancel_utterances(ctx, utterances)
        return actions

    def _promote(self) -> None:
        """Admitted: waiting utterances stream, in commit order, as the share allows."""
        if not self.admitted:
            return
        for utt in list(self._waiting):
            if len(self._holding) >= self._share:
                return
            ctx, segments = self._waiting.pop(utt)
            self._hold(utt)
            stream = self._stream_for(ctx)
            for segment in segments:
                stream.enqueue(segment)

    def _release_slot(self, utt: Utterance) -> None:
        """``utt`` streams no more (its committed text is spoken, or it was
        cancelled): the session's share frees; its admission stays."""
        utt.holds_slot = False
        self._holding.discard(utt)
        self._waiting.pop(utt, None)
        if self._door is not None and self._door.state == "waiting" and not self._waiting:
            # nothing waits at the door any more (cancelled): leave the queue
            self.admission.release(self._door)
            self._door = None
        self._promote()

    def _leave(self) -> None:
        """The session ends: its admission goes back to the gate."""
        if self._door is not None:
            self.admission.release(self._door)
            self._door = None

    def _stream_for(self, ctx: Context) -> AudioStream:
        utt = ctx.utterance
        framing = utt.config.framing if utt is not None else self.config.framing
        if framing == "raw":
            return self.shared_stream
        stream = self._context_streams.get(ctx)
        if stream is None:
            stream = AudioStream(self._stream_env, f"ctx{ctx.number}")
            self._context_streams[ctx] = stream
        return stream

    def _on_flush(self, cid: str | None, done: bool) -> Context | None:
        ctx = self._context(cid) if done else self.contexts.get(cid)
        if ctx is None or ctx.utterance is None:
            return ctx
        if ctx.policy.buffered.strip():
            self._check_slot(
                f"{'input.done' if done else 'input.flush'} was not applied (the text stays"
                " buffered)",
            )
        ctx.cancel_segment_timer()
        self._enqueue(ctx, [c.text for c in ctx.policy.flush()])
        return ctx

    def _on_done(self, cid: str | None) -> list[Action]:
        ctx = self._on_flush(cid, done=True)
        assert ctx is not None
        # an empty input.done still ends an utterance: vllm-omni answers it
        # with a session.done of 0 sentences
        utt = ctx.utterance or self._start_utterance(ctx)
        utt.done_received = True
        self._finish_reading(utt)
        self._stream_for(ctx).close_if_complete(utt)
        ctx.utterance = None
        ctx.pending.append(utt)
        ctx.policy.end_utterance()
        return list(self.segment_dequeued(ctx))

    def _on_playback(self, cid: str | None, played_ms: float) -> None:
        ctx = self.contexts.get(cid)
        if ctx is None:
            return
        now = time.monotonic()
        # read under every flow-control mode since protocol 1.1: the
        # segmentation policy plans with the listener's buffer
        ctx.listener.on_played(played_ms, now)
        # an underrun the server caused: the listener has played everything
        # sent while the server still had text of this context to speak
        # (waiting for more text from the client is starvation, not counted)
        starved = played_ms >= ctx.listener.sent_ms and self._stream_for(ctx).has_work_for(ctx)
        if starved and not ctx.underrun:
            self.metrics.underruns.inc()
        ctx.underrun = starved

    # ------------------------------------------------------------------
    # what the audio streams report (``audio_stream.StreamHost``)
    # ------------------------------------------------------------------
    def segment_dequeued(self, ctx: Context) -> list[protocol.ServerMessage]:
        """``session.done`` for each finished utterance of ``ctx``, in order."""
        messages: list[protocol.ServerMessage] = []
        while ctx.pending:
            utt = ctx.pending[0]
            if self._has_work_for(utt, ctx):
                break
            ctx.pending.pop(0)
            if utt.unsent_text:  # ended by session.close with text never flushed
                messages += self._report_unflushed(ctx, utt)
                continue
            self._release_slot(utt)
            if utt.unclosed is not None:  # SSML left open at the end
                messages.append(_unclosed_error(ctx.id, utt.unclosed))
            messages.append(utt.session_done(ctx.id))
        # the open utterance's committed text is all spoken: it waits for
        # more text and holds no slot meanwhile
        current = ctx.utterance
        if current is not None and not self._has_work_for(current, ctx):
            self._release_slot(current)
        return messages

    def listener_silent(self, ctx: Context) -> list[protocol.ServerMessage]:
        """Audio of ``ctx`` waited ``ack_timeout_s`` on a closed ``ack`` window
        with no ``playback``: tell the client, cancel and report its utterances
        (their slots are released with the report)."""
        error = GatewayError(
            ErrorCode.LISTENER_SILENT,
            f"no playback report for {self.settings.ack_timeout_s:g} s while audio waited on"
            ' the flow_control "ack" window; the utterance was cancelled. Send playback'
            " (played_ms) as audio plays, or use flow_control realtime",
        )
        actions = [*self.report_error(error, ctx.id), *self.cancel(ctx.id)]
        return [a for a in actions if not isinstance(a, Close | CloseWhenDone | AnswerVoiceRequest)]

    def cancelled_audio_ended(
        self, ctx: Context, open_segment: Segment | None, *, delivered: bool
    ) -> list[protocol.ServerMessage]:
        """The reports that waited for the last frame of cancelled audio."""
        reports, ctx.awaiting_report = ctx.awaiting_report, []
        if not reports:
            return []
        if not delivered:  # nobody to tell; the slots are released here
            for utt in reports:
                self._release_slot(utt)
            return []
        return self._report_cancel(ctx, reports, open_segment)

    # ------------------------------------------------------------------
    # cancel, drain, close
    # ------------------------------------------------------------------
    def cancel(self, cid: str | None) -> list[Action]:
        """Stop a context's current and queued audio and discard its text
        (``"*"``: every context).

        The report is returned at once when none of the context's audio is
        in flight; otherwise the stream sends it right after its last frame."""
        messages: list[Action] = []
        for ctx in self.contexts.targets(cid):
            utterances = ctx.open_utterances()
            if utterances:
                messages += self._cancel_utterances(ctx, utterances)
        return messages

    def begin_drain(self, *, closing: bool = False) -> list[Action]:
        """No new utterance starts; those that received ``input.done`` go on.

        Server shutdown: utterances still accepting text (no ``input.done``)
        are cancelled and reported.  ``closing`` (``session.close``): they
        end instead, as at ``input.done`` but without its flush: what was
        committed (``input.flush``, cuts) is spoken, and the text still in
        the segmenter is reported unspoken after it (``_report_unflushed``)."""
        if closing:
            self.closing = True
        else:
            self.draining = True
        messages: list[Action] = []
        for ctx in self.contexts:
            if ctx.utterance is None:
                continue
            if closing:
                messages += self._end_unflushed(ctx)
            else:
                messages += self._cancel_utterances(ctx, [ctx.utterance])
        return messages

    def _end_unflushed(self, ctx: Context) -> list[protocol.ServerMessage]:
        """End the context's open utterance for ``session.close``: its
        committed segments go on; the text never committed is set aside."""
        utt = ctx.utterance
        assert utt is not None
        ctx.cancel_segment_timer()
        utt.unsent_text = ctx.policy.discard().strip()
        utt.done_received = True  # no more text: the engine's input stream may end
        self._stream_for(ctx).close_if_complete(utt)
        ctx.utterance = None
        ctx.pending.append(utt)
        ctx.policy.end_utterance()
        return self.segment_dequeued(ctx)

    def _report_unflushed(self, ctx: Context, utt: Utterance) -> list[protocol.ServerMessage]:
        """An utterance ended by ``session.close`` has spoken all it committed:
        the cancel report, with everything sent counted as heard (nothing was
        interrupted) and the text never flushed as ``unspoken_text``."""
        self.metrics.cancels.inc()
        self._release_slot(utt)
        return cancel_report(ctx.id, [utt], utt.flow_offset_ms + utt.audio.sent_ms, "sent_ms")

    def _cancel_utterances(self, ctx: Context, utterances: list[Utterance]) -> list[Action]:
        """Stop these utterances of a context: their queued segments, their
        engine work and (for the open one) the text still buffered."""
        for utt in utterances:
            utt.cancelled = True
        if ctx.utterance is not None and ctx.utterance in utterances:
            ctx.utterance.unsent_text = ctx.policy.discard().strip()
            ctx.utterance = None
        ctx.pending = [u for u in ctx.pending if u not in utterances]
        ctx.listener.interrupt()
        ctx.cancel_segment_timer()
        if self._stream_for(ctx).cancel(utterances):
            # one of them is being spoken: the stream reports after its last frame
            ctx.awaiting_report.extend(utterances)
            return []
        return list(self._report_cancel(ctx, utterances, None))

    def _report_cancel(
        self,
        ctx: Context,
        utterances: list[Utterance],
        open_segment: Segment | None,
    ) -> list[protocol.ServerMessage]:
        position, source = ctx.listener.position(time.monotonic())
        for utt in utterances:
            self.metrics.cancels.inc()
            self._release_slot(utt)
        sent_bytes = 0 if open_segment is None else open_segment.audio.sent_bytes
        return cancel_report(ctx.id, utterances, position, source, open_segment, sent_bytes)

    def begin_close(self) -> list[Action] | None:
        """Start closing: the cancel reports of everything in progress, or
        None if the session is already closing."""
        if self.state is not State.OPEN:
            return None
        self._transition(State.CLOSING)
        return self.cancel("*")

    async def settle(self, timeout_s: float = 1.0) -> None:
        """Wait briefly for the streams to report the cancel of in-flight audio."""
        for stream in self.streams():
            for _ in range(round(timeout_s / 0.01)):
                if stream.current is None:
                    break
                await asyncio.sleep(0.01)

    def connection_lost(self) -> None:
        """The socket is gone: stop all engine work now."""
        for ctx in self.contexts:
            for utt in ctx.open_utterances():
                utt.cancelled = True
            ctx.listener.interrupt()
        for stream in self.streams():
            stream.cancel_jobs()

    async def shutdown(self) -> None:
        """Stop every task and engine job of this session."""
        self.connection_lost()
        self._waiting.clear()
        for ctx in self.contexts:
            ctx.cancel_segment_timer()
            live = [*ctx.pending, *ctx.awaiting_report]
            if ctx.utterance is not None:
                live.append(ctx.utterance)
            for utt in live:
                self._release_slot(utt)
            ctx.utterance = None
            ctx.pending = []
            ctx.awaiting_report = []
        for utt in list(self._holding):
            self._release_slot(utt)
        self._leave()
        await asyncio.gather(*(s.stop() for s in self.streams()), return_exceptions=True)
        if self.state is not State.CLOSED:
            self._transition(State.CLOSED)
