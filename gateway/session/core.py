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

The concepts it wires together each have a module: the actions
(``actions``), ``session.created`` (``created``), the config (``config``),
the lifecycle (``lifecycle``), contexts and utterances (``contexts``,
``utterance``), committing text (``commit``, with ``segmentation`` and its
timer and the front-end's ``reading``), admission (``door``), the audio
streams (``streams``, ``audio_stream``) and their ledger (``ledger``), and
how utterances end (``endings``: ``session.done``, cancel reports, drain).

Lifecycle: ``OPEN`` -> ``CLOSING`` -> ``CLOSED``.  ``session.close`` (since
protocol 2.0.0) first *finishes* while still ``OPEN``
(``begin_drain(closing=True)``, the same drain as a server shutdown's): no
new utterance starts, what was committed is spoken, and the route closes
once nothing is left or ``drain_timeout_s`` passed (``CloseWhenDone``);
``cancel`` and ``playback`` are read meanwhile.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, assert_never

from gateway import protocol
from gateway.engines.base import Engine
from gateway.errors import CloseCode, ErrorCode, GatewayError
from gateway.flow.admission import AdmissionGate, Ticket
from gateway.flow.budget import DecodeBudget
from gateway.session import reading, segmentation
from gateway.session.actions import (
    Action,
    AnswerVoiceRequest,
    Close,
    CloseWhenDone,
    error_actions,
)
from gateway.session.audio_stream import AudioStream, Sender, StreamEnv
from gateway.session.commit import Committer
from gateway.session.config import apply_for_engine, default_config
from gateway.session.contexts import Context, Contexts
from gateway.session.created import session_created, session_limits
from gateway.session.door import SessionDoor
from gateway.session.endings import Endings
from gateway.session.lifecycle import State, transition
from gateway.session.streams import SessionStreams
from gateway.session.utterance import Utterance
from gateway.text.policy import SegmentPolicy
from gateway.text.segmenter import Segmenter
from gateway.text.stage import EngineTextBudget, Lexicon

if TYPE_CHECKING:
    from gateway.ops.metrics import Metrics
    from gateway.settings import Settings

__all__ = ["Action", "AnswerVoiceRequest", "Close", "CloseWhenDone", "Session", "State"]

log = logging.getLogger(__name__)

RESUME_NOT_FIRST = "session.resume must be the first message of a new connection"


class SessionLog(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every record with the session id (never the spoken text)."""

    def process(self, msg: object, kwargs: MutableMapping[str, Any]) -> tuple[object, Any]:
        extra = self.extra or {}
        return f"[session={extra.get('session')}] {msg}", kwargs


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
        self.log = SessionLog(log, {"session": self.id})
        #: the session's admission: the door, then its share (``gateway.session.door``)
        self.door = SessionDoor(
            admission,
            client,
            settings.max_streams_per_session,
            lambda ctx, item: self._stream_for(ctx).enqueue(item),
            self.log,
        )
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
        #: text committed: the policy's cuts to the door and the streams
        self.committer = Committer(
            self.door,
            self._stream_for,
            lambda: self.state is State.OPEN,
            self,
            self._slot_decided,
        )
        #: how utterances end; what the audio streams report to (``StreamHost``)
        self.endings = Endings(
            self.contexts,
            self.door,
            self._stream_for,
            lambda: self.audio_streams.cancel_jobs(),
            self.report_error,
            metrics,
            settings.ack_timeout_s,
        )
        # the core never sends: it hands the sender to its audio streams
        self.audio_streams = SessionStreams(
            StreamEnv(
                engine=engine,
                voice_rates={v.name: v.sample_rate for v in engine.voices()},
                budget=self.budget,
                out=out,
                label=self.id,
                log=self.log,
                host=self.endings,
                metrics=metrics,
            )
        )

    # ------------------------------------------------------------------
    # state
    # ------------------------------------------------------------------
    def _transition(self, new: State) -> None:
        self.state = transition(self.state, new)

    def limits(self) -> protocol.Limits:
        return session_limits(self.settings, self.engine)

    def created_message(self, resume: tuple[str, float] | None = None) -> protocol.SessionCreated:
        return session_created(self.id, self.engine, self.config, self.limits(), resume)

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
        return self._stream_for(ctx).has_work_for(ctx) or self.door.waits_for(ctx)

    def streams(self) -> list[AudioStream]:
        return self.audio_streams.all()

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
            case protocol.SessionResume():
                raise GatewayError(ErrorCode.RESUME_INVALID, RESUME_NOT_FIRST)
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
        """The ``error`` event for ``error``, then a ``Close`` if it is fatal
        (``actions.error_actions``)."""
        self.log.info("error %s: %s", error.code, error.message)
        return error_actions(
            error,
            context_id,
            config_accepted=self.config_accepted,
            request_id=request_id,
            may_be_fatal=may_be_fatal,
        )

    def _on_config(self, message: protocol.SessionConfig) -> list[Action]:
        """``message`` has its voice names resolved (``VoiceDesk.resolve_config_voices``)."""
        new, options = apply_for_engine(
            self.config, self.clone_options, message, self.engine, busy=self.busy
        )
        self.config = new
        self.clone_options = options
        self.config_accepted = True
        return [protocol.SessionUpdated(config=new, limits=self.limits())]

    def _context(self, cid: str | None) -> Context:
        ctx, forgotten = self.contexts.get_or_create(cid, self._new_policy)
        for old in forgotten:
            self.audio_streams.forget(old)
        return ctx

    def _new_policy(self, segmenter: Segmenter | None = None) -> SegmentPolicy:
        return segmentation.new_policy(
            self.config, self.settings, self.engine.capabilities, segmenter
        )

    def _on_text(self, cid: str | None, text: str) -> None:
        if len(text.encode("utf-8", "surrogatepass")) > self.settings.max_input_text_bytes:
            raise GatewayError(
                ErrorCode.TEXT_TOO_LONG,
                f"input.text is over {self.settings.max_input_text_bytes} bytes; send it in"
                " smaller increments",
            )
        ctx = self._context(cid)
        utt = ctx.utterance
        self.door.check("this text was not accepted")
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
        self.committer.push(ctx, text)

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
            frontend=reading.new_frontend(self.config, self.engine.capabilities, self.lexicon),
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

    # --- admission (``gateway.session.door``) -------------------------------
    @property
    def admitted(self) -> bool:
        return self.door.admitted

    def speaking(self) -> bool:
        """Some utterance of this session is streaming or waiting to (the
        capacity follower counts admitted sessions that speak)."""
        return self.door.speaking()

    def _slot_decided(self, ticket: Ticket) -> None:
        if self.slot_listener is not None:
            self.slot_listener(ticket)
        else:
            self.slot_event(ticket)

    def slot_event(self, ticket: Ticket) -> list[Action]:
        """The gate decided the session's waiting ticket: on a grant the
        waiting segments go to their streams and the text held meanwhile is
        cut; on a refusal (deadline, draining) every waiting utterance is
        answered ``busy`` and reported as not spoken (nothing of this
        session was spoken yet)."""
        if ticket is not self.door.ticket or self.state is not State.OPEN:
            return []  # withdrawn meanwhile (cancel, close): nothing waits for it
        if ticket.state == "granted":
            self.door.granted(ticket)
            for ctx in self.contexts:
                self.committer.let_in(ctx)
            return []
        error, refused = self.door.refused(ticket)
        actions: list[Action] = []
        for ctx, utterances in refused.items():
            actions += self.report_error(error, ctx.id)
            actions += self.endings.cancel_utterances(ctx, utterances)
        return actions

    def _stream_for(self, ctx: Context) -> AudioStream:
        utt = ctx.utterance
        framing = utt.config.framing if utt is not None else self.config.framing
        return self.audio_streams.for_context(ctx, framing)

    def _on_flush(self, cid: str | None, done: bool) -> Context | None:
        ctx = self._context(cid) if done else self.contexts.get(cid)
        if ctx is None or ctx.utterance is None:
            return ctx
        if ctx.policy.buffered.strip():
            self.door.check(
                f"{'input.done' if done else 'input.flush'} was not applied (the text stays"
                " buffered)",
            )
        self.committer.flush(ctx)
        return ctx

    def _on_done(self, cid: str | None) -> list[Action]:
        ctx = self._on_flush(cid, done=True)
        assert ctx is not None
        # an empty input.done still ends an utterance: vllm-omni answers it
        # with a session.done of 0 sentences
        utt = ctx.utterance or self._start_utterance(ctx)
        utt.done_received = True
        reading.finish_reading(utt)
        self._stream_for(ctx).close_if_complete(utt)
        ctx.utterance = None
        ctx.pending.append(utt)
        ctx.policy.end_utterance()
        return list(self.endings.segment_dequeued(ctx))

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
    # cancel, drain, close (how utterances end: ``gateway.session.endings``)
    # ------------------------------------------------------------------
    def cancel(self, cid: str | None) -> list[Action]:
        """Stop a context's current and queued audio and discard its text
        (``"*"``: every context); the reports at once, or after the last
        frame in flight."""
        return self.endings.cancel(cid)

    def begin_drain(self, *, closing: bool = False) -> list[Action]:
        """No new utterance starts; those that received ``input.done`` go on.

        Server shutdown: utterances still accepting text (no ``input.done``)
        are cancelled and reported.  ``closing`` (``session.close``): they
        end instead, as at ``input.done`` but without its flush: what was
        committed (``input.flush``, cuts) is spoken, and the text still in
        the segmenter is reported unspoken after it (``Endings.end_unflushed``)."""
        if closing:
            self.closing = True
        else:
            self.draining = True
        messages: list[Action] = []
        for ctx in self.contexts:
            if ctx.utterance is None:
                continue
            if closing:
                messages += self.endings.end_unflushed(ctx)
            else:
                messages += self.endings.cancel_utterances(ctx, [ctx.utterance])
        return messages

    def begin_close(self) -> list[Action] | None:
        """Start closing: the cancel reports of all in progress (None: already)."""
        if self.state is not State.OPEN:
            return None
        self._transition(State.CLOSING)
        return self.cancel("*")

    def connection_lost(self) -> None:
        """The socket is gone: stop all engine work now."""
        self.endings.connection_lost()

    def unheard(self) -> list[tuple[str | None, str]]:
        """Per context with any, the text sent and not heard (``Endings``)."""
        return self.endings.unheard()

    async def settle(self, timeout_s: float = 1.0) -> None:
        """Wait briefly for the streams to report the cancel of in-flight audio."""
        await self.audio_streams.settle(timeout_s)

    async def shutdown(self) -> None:
        """Stop every task and engine job of this session."""
        self.connection_lost()
        self.door.waiting.clear()
        for ctx in self.contexts:
            ctx.cancel_segment_timer()
            for utt in [*ctx.pending, *ctx.awaiting_report, *filter(None, [ctx.utterance])]:
                self.door.release(utt)
            ctx.utterance = None
            ctx.pending = []
            ctx.awaiting_report = []
        for utt in list(self.door.holding):
            self.door.release(utt)
        self.door.leave()
        await self.audio_streams.stop()
        if self.state is not State.CLOSED:
            self._transition(State.CLOSED)
