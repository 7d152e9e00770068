"""The WebSocket endpoint ``/v1/audio/speech/stream``: a thin async layer.

It admits the connection, then runs the reader loop: receive a frame,
decode it into a typed message, hand it to the session core
(``gateway.session.core.Session.handle``) and perform the actions it returns
(``Connection.perform``: send a message, answer a voice request, close).
It never waits on synthesis.  Everything about state lives in
``gateway.session.core``; every send goes through ``gateway.ws.outbound.Outbound``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time

from starlette.websockets import WebSocket

from gateway import protocol
from gateway.errors import CloseCode, ErrorCode, GatewayError
from gateway.flow.admission import Ticket
from gateway.http.security import agent_identity, check_websocket, presented_key
from gateway.session.core import (
    Action,
    AnswerVoiceRequest,
    Close,
    CloseWhenDone,
    Session,
    State,
)
from gateway.session.created import session_resumed
from gateway.session.replay import ReplayInvalid, ReplayLog, ReplayLost
from gateway.session.resume_book import ResumeExpired, credential_of
from gateway.session.validation import ignored_fields_message, named_fields
from gateway.session.voice_requests import VoiceDesk, VoiceRequest
from gateway.state import DRAIN_POLL_S, GatewayState, RateLimiter
from gateway.voices.store import VoiceStore
from gateway.ws.outbound import ConnectionGone, Outbound
from gateway.ws.pings import SCOPE_KEY as PINGS_KEY
from gateway.ws.pings import PingWatch
from gateway.ws.resumable import ResumableSender

log = logging.getLogger(__name__)


async def stream_endpoint(websocket: WebSocket) -> None:
    state: GatewayState = websocket.app.state.gateway
    settings = state.settings
    rejection = check_websocket(websocket, state)
    await websocket.accept(subprotocol=_echo_subprotocol(websocket))
    out = Outbound(websocket, state.metrics, settings.stall_timeout_s)
    if rejection is not None:
        await _refuse(out, rejection)
        return
    if state.shutting_down or not state.ready:
        await _refuse(
            out,
            GatewayError(ErrorCode.BUSY, "the server is starting or shutting down; retry"),
            CloseCode.TRY_AGAIN,
        )
        return
    # per-client limits: per agent key when one is presented, else per address
    agent = agent_identity(websocket, state)
    address = websocket.client.host if websocket.client else "unknown"
    client = agent or address
    holder = "this agent key" if agent else "this address"
    per_client = settings.max_sessions_per_agent_key if agent else settings.max_sessions_per_client
    if not state.connection_allowed(client):
        await _refuse(
            out,
            GatewayError(
                ErrorCode.RATE_LIMITED,
                f"more than {settings.max_connections_per_minute} connections per minute"
                f" from {holder}; slow down",
            ),
            CloseCode.POLICY,
        )
        return
    full: GatewayError | None = None
    if state.sessions_by_client.get(client, 0) >= per_client:
        full = GatewayError(ErrorCode.BUSY, f"{holder} already has {per_client} sessions open")
    elif state.sessions >= settings.max_sessions:
        full = GatewayError(
            ErrorCode.BUSY, f"the server is at its limit of {settings.max_sessions} sessions"
        )
    if full is not None and not state.resumes.suspended:
        await _refuse(out, full, CloseCode.TRY_AGAIN)
        return
    credential = credential_of(presented_key(websocket))
    conn = _open_session(state, out, client, credential, websocket.app.state.voice_store)
    # at a limit that suspended sessions fill: this connection may only resume one
    conn.resume_only = full
    session = conn.session
    session.log.info("session opened from %s%s", address, f" ({agent})" if agent else "")
    generation = conn.generation
    outcome: Outcome = Outcome.ENDED
    try:
        await conn.out.unlogged(session.created_message(conn.resume_offer()))
        read = await _read_loop(websocket, conn)
        if isinstance(read, protocol.SessionResume):
            placeholder = conn
            try:
                conn = await _resume(state, out, read, credential, client)
            except GatewayError as refused:
                state.metrics.resumes_refused.labels(refused.code.value).inc()
                raise
            state.metrics.resumes_accepted.inc()
            await _end_session(state, placeholder, "replaced by a resume")
            generation = conn.generation
            conn.session.log.info("session resumed from %s", address)
            read = await _read_loop(websocket, conn, first=False)
        outcome = read if isinstance(read, Outcome) else Outcome.ENDED
    except GatewayError as error:  # a refused session.resume (or new session: resume_only)
        conn.session.log.info("resume refused: %s", error.code)
        await _refuse(out, error)
    except ConnectionGone:
        pass
    except Exception:  # a server bug: say so (1011) rather than drop the connection
        conn.session.log.exception("session failed unexpectedly")
        await _fail(conn)
    finally:
        if conn.generation != generation:
            pass  # a resume took the session: the new connection owns it now
        elif outcome is Outcome.SUSPENDED and not conn.out.ended:
            conn.suspend()
        else:
            await _end_session(state, conn, "session closed")


#: close codes of a connection that dropped rather than ended: lost
#: without a close frame (uvicorn reports 1005 after the handshake, 1006
#: before; a close frame without a code is 1005 too and cannot be told
#: apart), a proxy or server restarting (1012 service restart, 1013 try
#: again later, 1014 bad gateway)
DROPPED = frozenset({1005, 1006, 1012, 1013, 1014})


class Outcome(enum.Enum):
    """How a connection's reader ended."""

    ENDED = "ended"  #: the session ends with it
    SUSPENDED = "suspended"  #: it dropped: the session waits for a resume


def _open_session(
    state: GatewayState, out: Outbound, client: str, credential: str, voice_store: VoiceStore
) -> Connection:
    """A new session and its connection, counted against the limits."""
    settings = state.settings
    holder: list[Connection] = []
    sender = ResumableSender(
        out,
        ReplayLog(settings.resume_retention_bytes),
        lambda: bool(holder) and holder[0].resumable(),
    )
    session = Session(
        state.engine,
        settings,
        state.metrics,
        state.admission,
        sender,
        client=client,
        lexicon=state.lexicon,
    )
    conn = Connection(session, sender, VoiceDesk(state.engine, settings, voice_store))
    holder.append(conn)
    conn.state = state
    conn.client = client
    conn.credential = credential
    state.sessions += 1
    state.sessions_by_client[client] = state.sessions_by_client.get(client, 0) + 1
    state.live_sessions.add(conn)
    state.metrics.sessions_active.inc()
    return conn


async def _end_session(state: GatewayState, conn: Connection, why: str) -> None:
    """The session ends: its work stops, it no longer counts."""
    if conn.ended:
        return
    conn.ended = True
    state.resumes.forget(conn.token_hash)
    conn.out.end()
    await conn.stop_voice_requests()
    await conn.session.shutdown()
    state.sessions -= 1
    state.sessions_by_client[conn.client] -= 1
    if not state.sessions_by_client[conn.client]:
        del state.sessions_by_client[conn.client]
    state.live_sessions.discard(conn)
    state.metrics.sessions_active.dec()
    conn.session.log.info(why)


async def _resume(
    state: GatewayState,
    out: Outbound,
    request: protocol.SessionResume,
    credential: str,
    client: str,
) -> Connection:
    """Attach the session ``request`` names to ``out``: the new
    ``session.created``, ``session.resumed``, what the client did not get.
    ``GatewayError`` when refused (the session ends unless the key was
    wrong, the token another gateway's or the client over its rate)."""
    if not state.resume_allowed(client):
        raise GatewayError(
            ErrorCode.RATE_LIMITED,
            f"more than {state.settings.max_resumes_per_minute} session.resume attempts per"
            " minute from this client; wait before trying again",
        )
    taken = state.resumes.take(request.resume_token, credential)
    assert isinstance(taken, Connection)
    conn = taken
    received = {r.context_id: r.messages for r in request.received}
    try:
        replay = conn.out.log.unreceived(received, request.events)
    except ReplayInvalid as exc:
        conn.expire()
        raise GatewayError(ErrorCode.RESUME_INVALID, f"{exc}; the session has ended") from None
    except ReplayLost as exc:
        raise state.resumes.end(
            conn, f"{exc} (resume_retention_bytes); the session has ended"
        ) from None
    session = conn.session
    created = session.created_message(conn.resume_offer())
    resumed = session_resumed(
        session.id,
        [
            (ctx.id, ctx.utterance.accepted_chars if ctx.utterance is not None else 0)
            for ctx in session.contexts
        ],
        received,
        len(replay),
    )
    conn.out.log.resumed_at(replay)
    conn.generation += 1
    state.live_sessions.add(conn)
    try:
        await conn.out.attach(out, [created, resumed], replay)
    except ConnectionGone:
        conn.suspend()
        raise
    return conn


#: voice requests (``voice.*``) a session may have waiting for answers
MAX_WAITING_VOICE_REQUESTS = 4


class Connection:
    """A session core and its sender: performs what the core decides.

    Also what ``GatewayState`` drains at shutdown (``server_state.LiveSession``)."""

    def __init__(self, session: Session, out: ResumableSender, voices: VoiceDesk) -> None:
        self.session = session
        self.out = out
        self.voices = voices
        #: voice requests waiting for their answer, answered in order by one
        #: task, so an upload copied to slow upstream replicas never holds up
        #: the reader (a ``cancel`` behind it is read at once)
        self._voice_requests: asyncio.Queue[VoiceRequest] = asyncio.Queue(
            MAX_WAITING_VOICE_REQUESTS
        )
        self._voice_task: asyncio.Task[None] | None = None
        #: voice requests accepted and not yet answered (queued or being
        #: answered): a polite close waits for their answers
        self._unanswered = 0
        #: deliveries of admission decisions still sending (at most one per
        #: waiting utterance: bounded by ``max_contexts``)
        self._slot_deliveries: set[asyncio.Task[None]] = set()
        session.slot_listener = self.slot_decided
        #: ``session.close`` is being honoured: (the latest moment to close,
        #: the close code, its reason); the reader closes when the session is
        #: no longer busy or at that moment (``finishing_close``)
        self.close_when_done: tuple[float, int, str] | None = None
        #: set by ``_open_session``: the server, the client the session
        #: counts for, the credential its resume token is bound to
        self.state: GatewayState | None = None
        self.client = ""
        self.credential = ""
        #: the hash of its current resume token (None: none issued)
        self.token_hash: str | None = None
        #: bumped at each resume: a reader of an older connection stops
        self.generation = 0
        self.ended = False
        #: why a new session would have been refused: the connection was let
        #: in at a full server only to resume a suspended session
        self.resume_only: GatewayError | None = None
        #: the end of a suspended session that was not resumed in time
        self._expiry: asyncio.Task[None] | None = None

    # --- resume (``gateway.session.resume_book``) -------------------------------
    def resume_offer(self) -> tuple[str, float] | None:
        """A new resume token (the old one is forgotten) and the window."""
        state = self.state
        if state is None or state.settings.resume_window_s <= 0:
            return None
        state.resumes.forget(self.token_hash)
        token, self.token_hash = state.resumes.issue(self, self.credential)
        return token, state.settings.resume_window_s

    def resumable(self) -> bool:
        """A drop now suspends the session (else it ends it)."""
        session, state = self.session, self.state
        return (
            state is not None
            and self.token_hash is not None
            and not state.shutting_down
            and session.state is State.OPEN
            and not session.closing
            and not session.draining
            and self.close_when_done is None
            and not self.out.stalled
        )

    def suspend(self) -> None:
        """The connection dropped: the session waits ``resume_window_s``."""
        assert self.state is not None
        self.out.suspend()
        self.state.live_sessions.discard(self)
        self.state.resumes.suspend(self.token_hash or "", self.client, self.out.log.held_bytes)
        self.session.log.info("connection lost: suspended for a resume")

    def expire(self) -> asyncio.Task[None]:
        """Not resumed in time (or a drain): the session ends."""
        assert self.state is not None
        self.out.end()
        self.session.connection_lost()
        self._expiry = asyncio.create_task(_end_session(self.state, self, "resume window passed"))
        return self._expiry

    def unheard(self) -> list[protocol.UnspokenText]:
        """Per context, the text the client sent and did not hear."""
        return [
            protocol.UnspokenText(context_id=cid, unspoken_text=text)
            for cid, text in self.session.unheard()
        ]

    def take_over(self) -> None:
        """A resume arrived while the old connection still looked open."""
        self.out.suspend()
        self.out.out.abort()

    def slot_decided(self, ticket: Ticket) -> None:
        """The admission gate decided one of the session's waiting tickets:
        the core applies it now; what it answers is sent in order by a task."""
        actions = self.session.slot_event(ticket)
        if actions:
            task = asyncio.create_task(self._deliver(actions))
            self._slot_deliveries.add(task)
            task.add_done_callback(self._slot_deliveries.discard)

    async def _deliver(self, actions: list[Action]) -> None:
        try:
            await self.perform(actions)
        except ConnectionGone:
            self.session.connection_lost()

    def _queue_voice_request(self, request: VoiceRequest) -> list[Action]:
        """Hand ``request`` to the answering task; a refusal when too many wait."""
        try:
            self._voice_requests.put_nowait(request)
            self._unanswered += 1
        except asyncio.QueueFull:
            error = GatewayError(
                ErrorCode.BUSY,
                f"{MAX_WAITING_VOICE_REQUESTS} voice requests are already waiting for their"
                " answers; send the next one after a reply",
            )
            return self.session.report_error(
                error, request_id=request.request_id, may_be_fatal=False
            )
        if self._voice_task is None:
            self._voice_task = asyncio.create_task(self._answer_voice_requests())
        return []

    async def _answer_voice_requests(self) -> None:
        try:
            while True:
                request = await self._voice_requests.get()
                try:
                    await self._answer(request)
                finally:
                    self._voice_requests.task_done()
                    self._unanswered -= 1
        except ConnectionGone:
            return
        finally:
            # however answering ends, what is left can never be answered: drop
            # it, so a reader waiting for the answers (``receive``: a
            # ``session.config``) goes on, meets the closed connection and
            # ends the session
            while not self._voice_requests.empty():
                self._voice_requests.get_nowait()
                self._voice_requests.task_done()
                self._unanswered -= 1

    async def _answer(self, request: VoiceRequest) -> None:
        try:
            reply = await self.voices.answer(request)
        except Exception as exc:
            error = exc if isinstance(exc, GatewayError) else None
            if error is None:  # a bug answering this request: the next ones still are
                self.session.log.exception("answering a voice request failed")
                error = GatewayError(ErrorCode.INTERNAL, "the voice request failed; retry")
            refused = self.session.report_error(
                error, request_id=request.request_id, may_be_fatal=False
            )
            await self.perform(refused)  # never a Close: may_be_fatal=False
            return
        await self.out.event(reply)

    async def stop_voice_requests(self) -> None:
        """Stop answering (the session ends); unanswered requests are dropped."""
        task, self._voice_task = self._voice_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def perform(self, actions: list[Action]) -> bool:
        """Send, answer or close, in order; False once the session ends."""
        for action in actions:
            match action:
                case Close(code=code, reason=reason):
                    await self.close(code, reason)
                    return False
                case CloseWhenDone(code=code, reason=reason):
                    if self.close_when_done is None:
                        deadline = time.monotonic() + self.session.settings.drain_timeout_s
                        self.close_when_done = (deadline, code, reason)
                case AnswerVoiceRequest(request=request):
                    if not await self.perform(self._queue_voice_request(request)):
                        return False
                case _:
                    await self.out.event(action)
        return True

    async def receive(self, message: protocol.ClientMessage) -> bool:
        """Hand one decoded message to the core; False once the session ends."""
        if isinstance(message, protocol.SessionConfig):
            # a config may name a voice uploaded just before it: answer those first
            await self._voice_requests.join()
            try:
                message = await self.voices.resolve_config_voices(message)
            except GatewayError as error:
                return await self.perform(self.session.report_error(error))
        return await self.perform(self.session.handle(message))

    def busy(self) -> bool:
        return self.session.busy()

    async def begin_drain(self) -> None:
        await self.perform(self.session.begin_drain())

    async def finishing_close(self) -> bool:
        """After ``session.close``: close (1000) once nothing is left to speak
        and every voice request is answered, or at ``drain_timeout_s``, when
        ``close`` cancels and reports the rest.  True while the session goes
        on finishing."""
        if self.close_when_done is None:
            return False
        deadline, code, reason = self.close_when_done
        if (self.busy() or self._unanswered) and time.monotonic() < deadline:
            return True
        await self.close(code, reason)
        return False

    async def close(self, code: int, reason: str) -> None:
        """Cancel everything (reporting what was not spoken), then close."""
        session = self.session
        reports = session.begin_close()
        if reports is None:
            return
        try:
            await self.perform(reports)
            await session.settle()
        except ConnectionGone:
            pass
        await session.shutdown()
        await self.out.close(code, reason)


async def _read_loop(
    websocket: WebSocket, conn: Connection, *, first: bool = True
) -> Outcome | protocol.SessionResume:
    """Read until the session ends or its connection drops (``Outcome``),
    or return a first message ``session.resume`` for the endpoint."""
    session = conn.session
    settings = session.settings
    rate = RateLimiter(settings.max_messages_per_second, 1.0)
    last_rate_error = 0.0
    generation = conn.generation
    pings: PingWatch | None = websocket.scope.get(PINGS_KEY)
    #: when the idle period began: the last client message, ping frame or
    #: moment audio was still being produced
    active_at = time.monotonic()
    while session.state is State.OPEN:
        if first:
            timeout = settings.config_timeout_s
        else:
            timeout = max(0.0, active_at + settings.idle_timeout_s - time.monotonic())
        if conn.close_when_done is not None:
            # session.close: still reading (cancel, playback) while the
            # committed text is spoken; drain_timeout_s bounds it, not idleness
            if not await conn.finishing_close():
                return Outcome.ENDED
            timeout = DRAIN_POLL_S
        try:
            # asyncio.timeout: wait_for (3.11) can swallow a cancel of this task
            async with asyncio.timeout(timeout):
                frame = await websocket.receive()
        except TimeoutError:
            if conn.close_when_done is not None:
                continue
            if not first:
                if pings is not None and pings.last is not None and pings.last > active_at:
                    active_at = pings.last  # a ping frame: the client is there
                    continue
                if session.producing():
                    active_at = time.monotonic()  # audio still going out: not idle
                    continue
            which = "config" if first else "idle"
            limit = settings.config_timeout_s if first else settings.idle_timeout_s
            quiet = "no message" if first else "no message or ping"
            code = CloseCode.CONFIG_TIMEOUT if first else CloseCode.IDLE_TIMEOUT
            await conn.out.event(
                protocol.Error(
                    code=ErrorCode.TIMEOUT,
                    message=f"{which} timeout: {quiet} for {limit:g} s",
                    fatal=True,
                )
            )
            await conn.close(code, f"{which} timeout")
            return Outcome.ENDED
        was_first, first = first, False
        active_at = time.monotonic()
        if frame["type"] == "websocket.disconnect" or conn.generation != generation:
            if conn.generation != generation:
                return Outcome.ENDED  # a resume took the session
            # only a drop suspends: the connection lost without a close
            # frame (1005/1006), or a proxy restarting (1012-1014).  A client that
            # closes (1000, a tab going away 1001, its own codes) ended the
            # session; the WebSocket layer's 1007/1009 is the client's mistake
            if conn.resumable() and frame.get("code") in DROPPED:
                return Outcome.SUSPENDED
            session.connection_lost()
            return Outcome.ENDED
        if not rate.allow():
            now = time.monotonic()
            if now - last_rate_error >= 1.0:  # one error a second, not one per message
                last_rate_error = now
                error = GatewayError(
                    ErrorCode.RATE_LIMITED,
                    f"over {settings.max_messages_per_second} messages per second;"
                    " messages are being dropped",
                )
                if not await conn.perform(session.report_error(error)):
                    return Outcome.ENDED
            continue
        text = frame.get("text")
        if text is None:
            error = GatewayError(
                ErrorCode.INVALID_MESSAGE,
                "binary frames from the client are not part of the protocol; send JSON text",
            )
            if not await conn.perform(session.report_error(error)):
                return Outcome.ENDED
            continue
        try:
            message, ignored = await _decode(text)
        except GatewayError as error:
            if not await conn.perform(session.report_error(error)):
                return Outcome.ENDED
            continue
        if ignored:  # named, never fatal: vllm-omni's models ignore them too
            warning = protocol.WarningEvent(
                code="unknown_fields",
                message=ignored_fields_message(ignored),
                fields=named_fields(ignored),
            )
            if not await conn.perform([warning]):
                return Outcome.ENDED
        if was_first and isinstance(message, protocol.SessionResume):
            return message
        if was_first and conn.resume_only is not None:
            raise conn.resume_only  # refused (busy) as a new session
        if not await conn.receive(message):
            return Outcome.ENDED
    return Outcome.ENDED


#: a message longer than this (characters) is decoded off the event loop (a
#: ``session.config`` may carry megabytes of reference audio)
DECODE_IN_THREAD_CHARS = 64 * 1024


async def _decode(text: str) -> tuple[protocol.ClientMessage, list[str]]:
    """The message, and a ``session.config``'s unknown fields (ignored)."""
    if len(text) <= DECODE_IN_THREAD_CHARS:
        return _decode_now(text)
    return await asyncio.to_thread(_decode_now, text)


def _decode_now(text: str) -> tuple[protocol.ClientMessage, list[str]]:
    message = protocol.decode_client(text)
    if isinstance(message, protocol.SessionConfig):
        return message, protocol.unknown_config_fields(text)
    return message, []


async def _fail(conn: Connection) -> None:
    """An unexpected exception ended the session: ``internal`` (fatal), 1011."""
    try:
        await conn.out.event(
            protocol.Error(
                code=ErrorCode.INTERNAL,
                message="the server failed unexpectedly and closed this session; the details"
                " are in the server log. Reconnect to continue",
                fatal=True,
            )
        )
    except ConnectionGone:
        return
    try:
        await conn.close(CloseCode.INTERNAL, "internal error")
    except Exception as exc:  # the session's own close failed: close the socket
        conn.session.log.debug("close after failure failed: %r", exc)
        await conn.out.close(CloseCode.INTERNAL, "internal error")


def _echo_subprotocol(websocket: WebSocket) -> str | None:
    """Browsers that send their key as a subprotocol need one echoed back."""
    offered = websocket.scope.get("subprotocols") or []
    return "tts.v1" if "tts.v1" in offered else None


async def _refuse(out: Outbound, error: GatewayError, code: int | None = None) -> None:
    """Accept-then-explain-then-close, so browsers can see why."""
    spec = error.code.spec
    unspoken = error.unspoken if isinstance(error, ResumeExpired) else None
    try:
        await out.event(
            protocol.Error(code=error.code, message=error.message, fatal=True, unspoken=unspoken)
        )
    except ConnectionGone:
        return
    await out.close(code or spec.close_code or CloseCode.POLICY, str(error.code))
