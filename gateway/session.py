"""One WebSocket session: state, contexts and the full-duplex reader.

The reader never waits on synthesis: it decodes a client message, updates
state and returns to the socket, so ``cancel`` and ``playback`` are handled
while audio is being produced.  Audio is produced by ``speaker.AudioStream``
tasks; every send goes through ``outbound.Outbound``.

Lifecycle: ``OPEN`` (after ``session.created``) -> ``CLOSING`` (close asked,
error or disconnect: work is being cancelled) -> ``CLOSED``.  An illegal
transition raises at once.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from gateway import protocol
from gateway.audio.resample import StreamResampler
from gateway.engines.base import DecodeBudget, Engine, SynthesisJob
from gateway.engines.capabilities import capabilities_message
from gateway.errors import CloseCode, ErrorCode, GatewayError
from gateway.flow import FlowWindow
from gateway.outbound import ConnectionGone, Outbound
from gateway.segmenter import Segmenter
from gateway.session_config import apply_config, default_config
from gateway.speaker import AudioStream, Segment
from gateway.utterance import Sentence, Utterance
from gateway.voices import (
    add_voice,
    decode_base64_audio,
    find_speakable_voice,
    remove_voice,
    voice_listing,
)

if TYPE_CHECKING:
    from gateway.metrics import Metrics
    from gateway.server_state import StreamAdmission
    from gateway.settings import Settings
    from gateway.voice_store import VoiceStore

log = logging.getLogger(__name__)

DEFAULT_CONTEXT: str | None = None


class SessionLog(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every record with the session id (never the spoken text)."""

    def process(self, msg: object, kwargs: MutableMapping[str, Any]) -> tuple[object, Any]:
        extra = self.extra or {}
        return f"[session={extra.get('session')}] {msg}", kwargs


class State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(eq=False)
class Context:
    id: str | None
    number: int
    segmenter: Segmenter
    #: the utterance accepting text (until its ``input.done``)
    utterance: Utterance | None = None
    #: utterances whose ``input.done`` arrived and whose audio is still going out
    pending: list[Utterance] = field(default_factory=list)
    #: cancelled utterances whose report waits for the stream's last frame
    awaiting_report: list[Utterance] = field(default_factory=list)
    sequence: int = 0  #: tagged-frame sequence number
    stream: AudioStream | None = None  #: own stream under tagged framing
    eager_timer: asyncio.TimerHandle | None = None
    resampler: StreamResampler | None = None
    resampler_utterance: Utterance | None = None
    flow: FlowWindow = field(default_factory=FlowWindow)
    underrun: bool = False  #: in an underrun episode (metrics count episodes)


class Session:
    def __init__(
        self,
        out: Outbound,
        engine: Engine,
        settings: Settings,
        metrics: Metrics,
        admission: StreamAdmission,
        voice_store: VoiceStore,
    ) -> None:
        self.admission = admission
        #: decoded but unsent audio the session's engine jobs may hold
        self.budget = DecodeBudget(settings.max_buffered_ms / 1000)
        self.voice_store = voice_store
        self.id = uuid.uuid4().hex[:12]
        self.out = out
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.state = State.OPEN
        self.config = default_config(engine.default_voice(), engine.name)
        self.config_accepted = False
        #: the server is shutting down: no new utterance starts
        self.draining = False
        self.contexts: dict[str | None, Context] = {}
        self._context_numbers = 0
        self.utterances_started = 0
        self.shared_stream = AudioStream(self, "shared")
        self._voice_rates = {v.name: v.sample_rate for v in engine.voices()}
        self.log = SessionLog(log, {"session": self.id})

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
        return protocol.Limits(
            max_message_bytes=s.max_message_bytes,
            max_input_text_bytes=s.max_input_text_bytes,
            max_utterance_chars=s.max_utterance_chars,
            max_contexts=s.max_contexts,
            max_buffered_ms=s.max_buffered_ms,
            config_timeout_s=s.config_timeout_s,
            idle_timeout_s=s.idle_timeout_s,
            stall_timeout_s=s.stall_timeout_s,
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

    def engine_voice_rate(self, voice: str) -> int:
        return self._voice_rates[voice]

    def buffered_ms(self) -> float:
        """Audio decoded for this session and not yet sent, measured from the
        engine's statistics: an independent check of the budget (tests)."""
        return sum(stream.unsent_ms() for stream in self._streams())

    def busy(self) -> bool:
        """Any utterance in progress, text buffered, segments queued or audio unsent."""
        return any(self._context_live(c) for c in self.contexts.values())

    def producing(self) -> bool:
        """Audio being synthesized, queued or sent (the idle timer waits for
        it).  Text waiting in the segmenter for more input does not count: a
        client that sends half a sentence and goes quiet is idle, and the
        idle close reports that text as unspoken."""
        return any(
            ctx.pending or self._stream_for(ctx).has_work_for(ctx) for ctx in self.contexts.values()
        )

    def _context_live(self, ctx: Context) -> bool:
        return bool(
            ctx.utterance is not None
            or ctx.pending
            or ctx.segmenter.buffered.strip()
            or self._stream_for(ctx).has_work_for(ctx)
        )

    # ------------------------------------------------------------------
    # messages
    # ------------------------------------------------------------------
    async def handle(self, message: protocol.ClientMessage) -> bool:
        """Handle one decoded message; returns False when the session ends."""
        match message:
            case protocol.SessionConfig():
                await self._on_config(message)
            case protocol.InputText(text=text, context_id=cid):
                await self._on_text(cid, text)
            case protocol.InputFlush(context_id=cid):
                self._on_flush(cid, done=False)
            case protocol.InputDone(context_id=cid):
                await self._on_done(cid)
            case protocol.Cancel(context_id=cid):
                await self.cancel(cid)
            case protocol.Playback(played_ms=played, context_id=cid):
                self._on_playback(cid, played)
            case protocol.Ping(id=ping_id):
                await self.out.event(protocol.Pong(id=ping_id))
            case protocol.SessionClose():
                await self.close(CloseCode.NORMAL, "session.close")
                return False
            case protocol.VoiceList() | protocol.VoiceAdd() | protocol.VoiceRemove():
                await self._on_voice(message)
        return True

    async def report_error(
        self,
        error: GatewayError,
        context_id: str | None = None,
        *,
        request_id: protocol.RequestId = None,
        may_be_fatal: bool = True,
    ) -> bool:
        """Send an ``error`` event; returns True if it was fatal.

        ``may_be_fatal=False`` (a refused ``voice.*`` request) keeps the
        session open whatever the code's registry rule."""
        spec = error.code.spec
        fatal = may_be_fatal and (
            spec.fatal == "always" or (spec.fatal == "first_config" and not self.config_accepted)
        )
        self.log.info("error %s: %s", error.code, error.message)
        await self.out.event(
            protocol.Error(
                code=error.code,
                message=error.message,
                fatal=fatal,
                context_id=context_id,
                request_id=request_id,
            )
        )
        if fatal:
            await self.close(spec.close_code or CloseCode.POLICY, str(error.code))
        return fatal

    async def _on_voice(
        self, message: protocol.VoiceList | protocol.VoiceAdd | protocol.VoiceRemove
    ) -> None:
        """Voice management, through the functions the HTTP routes use.

        The store's I/O runs in a worker thread; the reader waits for it (so
        replies keep request order and a client cannot pile up uploads), while
        audio already in progress keeps streaming.  A refusal is a non-fatal
        ``error`` event carrying the request's ``request_id``."""
        engine, settings, store = self.engine, self.settings, self.voice_store
        result: protocol.ServerMessage
        try:
            match message:
                case protocol.VoiceList(request_id=rid):
                    listing = await voice_listing(engine, settings, store)
                    result = protocol.VoiceListResult(request_id=rid, voices=listing["data"])
                case protocol.VoiceAdd(request_id=rid):
                    voice = await add_voice(
                        engine,
                        settings,
                        store,
                        name=message.name,
                        data=decode_base64_audio(message.audio),
                        consent=message.consent,
                        ref_text=message.ref_text,
                        description=message.description,
                    )
                    result = protocol.VoiceAddResult(request_id=rid, voice=voice)
                case protocol.VoiceRemove(name=name, request_id=rid):
                    removed = await remove_voice(engine, settings, store, name)
                    result = protocol.VoiceRemoveResult(
                        request_id=rid, name=removed["name"], id=removed["id"]
                    )
        except GatewayError as error:
            await self.report_error(error, request_id=message.request_id, may_be_fatal=False)
            return
        await self.out.event(result)

    async def _on_config(self, message: protocol.SessionConfig) -> None:
        # aliases (``alloy`` ...) and uploaded voices resolve as in the HTTP API
        names = {}
        given = [v for v in (message.voice, message.speaker) if isinstance(v, str)]
        conflicting = len({v.strip().casefold() for v in given}) > 1  # apply_config says so
        for field_name in () if conflicting else ("voice", "speaker"):
            raw = getattr(message, field_name)
            if isinstance(raw, str) and self.engine.find_voice(raw) is None:
                voice = await find_speakable_voice(
                    self.engine, self.settings, self.voice_store, raw
                )
                names[field_name] = voice.name
        if names:
            message = msgspec.structs.replace(message, **names)
        new = apply_config(
            self.config,
            message,
            self.engine.voices(),
            self.engine.name,
            self.engine.model_names(),
        )
        if self.busy() and (new.framing != self.config.framing):
            raise GatewayError(
                ErrorCode.INVALID_STATE,
                "`framing` cannot change while an utterance is in progress;"
                " send it before the next utterance",
                param="framing",
            )
        self.config = new
        self.config_accepted = True
        await self.out.event(protocol.SessionUpdated(config=new, limits=self.limits()))

    def _context(self, cid: str | None, create: bool) -> Context | None:
        ctx = self.contexts.get(cid)
        if ctx is not None or not create:
            return ctx
        live = sum(1 for c in self.contexts.values() if self._context_live(c))
        if live >= self.settings.max_contexts:
            raise GatewayError(
                ErrorCode.INVALID_STATE,
                f"too many live contexts (limit {self.settings.max_contexts});"
                " finish or cancel one first",
            )
        # an idle context keeps its positions while its id may be reused;
        # forget the idle ones only when many ids have been seen
        if len(self.contexts) >= 4 * self.settings.max_contexts:
            for key in [k for k, c in self.contexts.items() if not self._context_live(c)]:
                del self.contexts[key]
        self._context_numbers = (self._context_numbers + 1) % 65536
        ctx = Context(
            id=cid,
            number=self._context_numbers,
            segmenter=self._new_segmenter(),
        )
        self.contexts[cid] = ctx
        return ctx

    def _new_segmenter(self) -> Segmenter:
        return Segmenter(
            self.config.split_granularity,
            eager_min_words=self.settings.eager_min_words,
            max_chars=self.settings.max_segment_chars,
        )

    async def _on_text(self, cid: str | None, text: str) -> None:
        if len(text.encode("utf-8", "surrogatepass")) > self.settings.max_input_text_bytes:
            raise GatewayError(
                ErrorCode.TEXT_TOO_LONG,
                f"input.text is over {self.settings.max_input_text_bytes} bytes; send it in"
                " smaller increments",
            )
        ctx = self._context(cid, create=True)
        assert ctx is not None
        utt = ctx.utterance
        if utt is None:
            utt = self._start_utterance(ctx)
        if utt.accepted_chars + len(text) > self.settings.max_utterance_chars:
            raise GatewayError(
                ErrorCode.TEXT_TOO_LONG,
                f"the utterance would exceed {self.settings.max_utterance_chars} characters;"
                " end it with input.done and start another",
            )
        utt.accepted_chars += len(text)
        self._enqueue(ctx, ctx.segmenter.push(text))
        self._arm_eager(ctx)

    def _start_utterance(self, ctx: Context) -> Utterance:
        if self.draining:
            raise GatewayError(
                ErrorCode.BUSY,
                "the server is shutting down; this text was not accepted,"
                " reconnect to another server",
            )
        if not self.admission.try_acquire():
            raise GatewayError(
                ErrorCode.BUSY,
                f"the server is streaming its limit of {self.admission.limit} utterances;"
                " this text was not accepted, retry shortly",
            )
        if ctx.segmenter.granularity != self.config.split_granularity:
            ctx.segmenter = self._new_segmenter()
        utt = Utterance(
            index=self.utterances_started,
            config=self.config,
            first_text_at=time.monotonic(),
        )
        self.utterances_started += 1
        ctx.utterance = utt
        ctx.flow.configure(self.config.flow_control, self.config.max_lead_ms)
        utt.flow_offset_ms = ctx.flow.sent_ms
        self.metrics.utterances.inc()
        return utt

    def _arm_eager(self, ctx: Context) -> None:
        if ctx.eager_timer is not None:
            ctx.eager_timer.cancel()
            ctx.eager_timer = None
        if (
            self.config.split_granularity == "auto"
            and ctx.utterance is not None
            and not ctx.utterance.sentences
            and ctx.segmenter.buffered.strip()
        ):
            loop = asyncio.get_running_loop()
            ctx.eager_timer = loop.call_later(
                self.settings.eager_wait_ms / 1000, self._eager_fire, ctx
            )

    def _eager_fire(self, ctx: Context) -> None:
        ctx.eager_timer = None
        if self.state is State.OPEN and ctx.utterance is not None:
            self._enqueue(ctx, ctx.segmenter.eager())

    def _enqueue(self, ctx: Context, texts: list[str]) -> None:
        utt = ctx.utterance
        if not texts or utt is None:
            return
        stream = self._stream_for(ctx)
        for text in texts:
            sentence = utt.add_sentence(text)
            if utt.ready_at is None:
                utt.ready_at = time.monotonic()
            stream.enqueue(Segment(ctx, utt, sentence))

    def _stream_for(self, ctx: Context) -> AudioStream:
        utt = ctx.utterance
        framing = utt.config.framing if utt is not None else self.config.framing
        if framing == "raw":
            return self.shared_stream
        if ctx.stream is None:
            ctx.stream = AudioStream(self, f"ctx{ctx.number}")
        return ctx.stream

    def _on_flush(self, cid: str | None, done: bool) -> Context | None:
        ctx = self._context(cid, create=done)
        if ctx is None or ctx.utterance is None:
            return ctx
        if ctx.eager_timer is not None:
            ctx.eager_timer.cancel()
            ctx.eager_timer = None
        self._enqueue(ctx, ctx.segmenter.flush())
        return ctx

    async def _on_done(self, cid: str | None) -> None:
        ctx = self._on_flush(cid, done=True)
        assert ctx is not None
        # an empty input.done still ends an utterance: vllm-omni answers it
        # with a session.done of 0 sentences
        utt = ctx.utterance or self._start_utterance(ctx)
        utt.done_received = True
        self._stream_for(ctx).close_if_complete(utt)
        ctx.utterance = None
        ctx.pending.append(utt)
        ctx.segmenter.end_utterance()
        await self.after_segment(ctx)

    def _on_playback(self, cid: str | None, played_ms: float) -> None:
        ctx = self.contexts.get(cid)
        if ctx is None:
            return
        ctx.flow.on_played(played_ms, time.monotonic())
        # an underrun the server caused: the listener has played everything
        # sent while the server still had text of this context to speak
        # (waiting for more text from the client is starvation, not counted)
        starved = played_ms >= ctx.flow.sent_ms and self._stream_for(ctx).has_work_for(ctx)
        if starved and not ctx.underrun:
            self.metrics.underruns.inc()
        ctx.underrun = starved

    async def flow_wait(self, ctx: Context, utt: Utterance, frame_ms: float) -> bool:
        """Hold a frame until the context's flow-control window admits it;
        False if the utterance was cancelled meanwhile (drop the frame)."""
        return await ctx.flow.admit(frame_ms, lambda: utt.cancelled or self.out.gone)

    # ------------------------------------------------------------------
    # utterance completion, cancel, close
    # ------------------------------------------------------------------
    def first_audio(self, utt: Utterance) -> None:
        utt.first_audio_at = time.monotonic()
        if utt.ready_at is not None:
            self.metrics.time_to_first_audio.observe(utt.first_audio_at - utt.ready_at)

    def account_job(self, utt: Utterance, job: SynthesisJob) -> None:
        stats = job.stats
        utt.compute_ms += stats.compute_ms
        if utt.queue_ms is None:
            utt.queue_ms = stats.queue_ms
        self.metrics.sentences.inc()
        if stats.extra.get("acoustic_ms"):
            self.metrics.acoustic_seconds.observe(stats.extra["acoustic_ms"] / 1000)
        if stats.first_chunk_ms:
            self.metrics.first_chunk_seconds.observe(stats.first_chunk_ms / 1000)

    async def after_segment(self, ctx: Context) -> None:
        """Send ``session.done`` for each finished utterance, in order."""
        stream = self._stream_for(ctx)
        while ctx.pending:
            utt = ctx.pending[0]
            if stream.has_work_for_utterance(utt):
                return
            ctx.pending.pop(0)
            self.admission.release()
            await self.out.event(utt.session_done(ctx.id))

    async def cancel(self, cid: str | None) -> None:
        """Stop a context's current and queued audio and discard its text.

        The report goes out at once when none of the context's audio is in
        flight; otherwise the stream sends it right after its last frame."""
        targets = (
            list(self.contexts.values())
            if cid == "*"
            else [c for c in [self.contexts.get(cid)] if c is not None]
        )
        for ctx in targets:
            utterances = [*ctx.pending, *([ctx.utterance] if ctx.utterance else [])]
            if utterances:
                await self._cancel_utterances(ctx, utterances)

    async def begin_drain(self) -> None:
        """Server shutdown: utterances still accepting text (no ``input.done``)
        are cancelled and reported; those that received ``input.done`` go on;
        no new utterance starts."""
        self.draining = True
        for ctx in list(self.contexts.values()):
            if ctx.utterance is not None:
                await self._cancel_utterances(ctx, [ctx.utterance])

    async def _cancel_utterances(self, ctx: Context, utterances: list[Utterance]) -> None:
        """Stop these utterances of a context: their queued segments, their
        engine work and (for the open one) the text still buffered.  The
        report goes out at once when none of their audio is in flight;
        otherwise the stream sends it right after its last frame."""
        for utt in utterances:
            utt.cancelled = True
        if ctx.utterance is not None and ctx.utterance in utterances:
            ctx.utterance.unsent_text = ctx.segmenter.discard().strip()
            ctx.utterance = None
        ctx.pending = [u for u in ctx.pending if u not in utterances]
        ctx.flow.interrupt()
        if ctx.eager_timer is not None:
            ctx.eager_timer.cancel()
            ctx.eager_timer = None
        stream = self._stream_for(ctx)
        stream.drop_utterances(utterances)
        current = stream.current
        if current is not None and current.utterance in utterances:
            assert current.job is not None
            ctx.awaiting_report.extend(utterances)
            current.job.cancel()
        else:
            await self.report_cancel(ctx, utterances, None, 0)

    async def send_cancel_reports(
        self, ctx: Context, open_sentence: Sentence | None, sent_bytes: int
    ) -> None:
        """Called by the stream after the last frame of cancelled audio."""
        reports, ctx.awaiting_report = ctx.awaiting_report, []
        if not reports:
            return
        if self.out.gone:  # nobody to tell; the streams are released here
            self.admission.release(len(reports))
            return
        await self.report_cancel(ctx, reports, open_sentence, sent_bytes)

    async def report_cancel(
        self,
        ctx: Context,
        utterances: list[Utterance],
        open_sentence: Sentence | None,
        sent_bytes: int,
    ) -> None:
        """For each cancelled utterance, in order: ``audio.cancelled``, then
        ``audio.done`` (if its sentence was open) and ``session.done``, all
        with ``cancelled: true``."""
        context_position, source = ctx.flow.position(time.monotonic())
        for utt in utterances:
            self.metrics.cancels.inc()
            self.admission.release()
            position = min(utt.sent_ms, max(0.0, context_position - utt.flow_offset_ms))
            spoken, unspoken = utt.heard_split(position, utt.unsent_text)
            await self.out.event(
                protocol.AudioCancelled(
                    context_id=ctx.id,
                    utterance_index=utt.index,
                    sent_ms=round(utt.sent_ms, 3),
                    played_ms=round(position, 3),
                    position_source=source,
                    spoken_text=spoken,
                    unspoken_text=unspoken,
                )
            )
            if open_sentence is not None and open_sentence in utt.sentences:
                open_sentence.audio_ms = utt.sent_ms - open_sentence.start_ms
                await self.out.event(
                    utt.audio_done(ctx.id, open_sentence, sent_bytes, cancelled=True)
                )
            await self.out.event(utt.session_done(ctx.id, cancelled=True))

    def _streams(self) -> list[AudioStream]:
        return [self.shared_stream] + [c.stream for c in self.contexts.values() if c.stream]

    async def close(self, code: int, reason: str) -> None:
        """Cancel everything (reporting what was not spoken), then close."""
        if self.state is not State.OPEN:
            return
        self._transition(State.CLOSING)
        try:
            await self.cancel("*")
            # wait briefly for streams to report the cancel of in-flight audio
            for stream in self._streams():
                if stream.current is not None:
                    for _ in range(100):
                        if stream.current is None:
                            break
                        await asyncio.sleep(0.01)
        except ConnectionGone:
            pass
        await self.shutdown()
        await self.out.close(code, reason)

    def connection_lost(self) -> None:
        """The socket is gone: stop all engine work now."""
        for ctx in self.contexts.values():
            for utt in [*ctx.pending, *([ctx.utterance] if ctx.utterance else [])]:
                utt.cancelled = True
            ctx.flow.interrupt()
        for stream in self._streams():
            for seg in stream.queue:
                if seg.job is not None:
                    seg.job.cancel()
            if stream.current is not None and stream.current.job is not None:
                stream.current.job.cancel()

    async def shutdown(self) -> None:
        """Stop every task and engine job of this session."""
        self.connection_lost()
        for ctx in self.contexts.values():
            if ctx.eager_timer is not None:
                ctx.eager_timer.cancel()
            live = len(ctx.pending) + (ctx.utterance is not None) + len(ctx.awaiting_report)
            self.admission.release(live)
            ctx.utterance = None
            ctx.pending = []
            ctx.awaiting_report = []
        await asyncio.gather(*(s.stop() for s in self._streams()), return_exceptions=True)
        if self.state is not State.CLOSED:
            self._transition(State.CLOSED)
