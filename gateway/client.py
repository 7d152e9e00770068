"""An async Python client for the streaming endpoint, for voice agents and tools.

    async with await Client.connect("ws://127.0.0.1:8000/v1/audio/speech/stream") as tts:
        await tts.send_text("Hello there. ")
        await tts.done()
        async for event in tts.events():
            match event:
                case AudioFrame(): play(event.data)
                case SessionDone(): break

Events are the protocol's own Structs (``gateway.protocol``: ``AudioStart``,
``AudioDone``, ``SessionDone``, ``AudioCancelled``, ...) plus ``AudioFrame``
for binary messages and ``Disconnected`` for the end of the connection.  The
tagged header is read by ``voice_gateway_wire.frames`` (integrations/wire),
the implementation the gateway and the framework plugins share.

Backpressure: one reader task moves messages from the socket into a bounded
queue (``max_queued`` items).  When the caller stops iterating, the queue
fills, the reader stops reading, ``websockets``' own bounded buffer fills, TCP
fills, and the server's sends block: a slow consumer slows the stream and the
client never buffers without bound.  Every item is stamped with the
``time.perf_counter()`` of its arrival, so measurements (``gateway.bench``)
do not depend on how fast the caller consumes.

Ending a session (protocol 2.0.0): ``finish()`` sends ``session.close``, and
the server speaks what was flushed before it closes; keep iterating
``events()`` until ``Disconnected`` (code 1000).  ``aclose()`` stops at once:
``cancel`` for every context, then ``session.close``, then the socket closes.

Resume (protocol 2.1.0, ``auto_resume``, on by default): when the connection
drops (no close frame, or a proxy's 1012-1014; never a close the client or
the server chose), the reader reconnects at once and sends
``session.resume`` with what it received, then the text the server does not
hold (``voice_gateway_wire.resume``, shared with the framework plugins).
The caller's ``events()`` goes on with no frame repeated or skipped and sees
no ``Disconnected``; text and ``input.done`` given meanwhile are held and
sent after the resume, other messages wait for it.  Tries are bounded by the
server's ``resume_window_s``.  A refused resume (``resume_invalid``,
``resume_expired``, ``resume_forbidden``), the window passing, or a server
that does not resume (``resume_window_s`` 0) ends the connection as before
2.1.0: text of utterances that had not finished (no ``session.done``) is
reported in ``Disconnected.failed``, and ``reconnect()`` opens a new session
with the same config and never re-sends anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import msgspec
from voice_gateway_wire.frames import TaggedHeader, unpack_frame
from voice_gateway_wire.resume import (
    WINDOW_MARGIN_S,
    Resumed,
    ResumeTracker,
    resume_url,
    retry_delay_s,
)
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from gateway.protocol import (
    AudioDone,
    AudioStart,
    Cancel,
    ClientMessage,
    EffectiveConfig,
    Error,
    InputDone,
    InputFlush,
    InputText,
    Ping,
    Playback,
    ServerMessage,
    SessionClose,
    SessionConfig,
    SessionCreated,
    SessionDone,
    SessionResumed,
    SessionUpdated,
    encode_text,
    server_decoder,
)

DEFAULT_URL = "ws://127.0.0.1:8000/v1/audio/speech/stream"

#: Recommended low-latency settings (docs/protocol.md): 20 ms PCM frames sent as
#: decoded, at the voice's native rate (``sample_rate`` left unset).
LOW_LATENCY = SessionConfig(response_format="pcm", stream_audio=True, frame_ms=20)

#: Items held between the socket and the caller.  50 items is about one second
#: of 20 ms frames; websockets' own queue (``max_queue``) adds its few frames.
DEFAULT_MAX_QUEUED = 50


class ClientError(Exception):
    """The server refused the session or config, or the connection is gone.

    ``error``: the server's ``error`` event when it said why (a refused
    ``resume()``: on ``resume_expired``, its ``unspoken`` is the text not
    heard, to send again on a new session)."""

    def __init__(self, message: str, error: Error | None = None) -> None:
        super().__init__(message)
        self.error = error


class ResumeRefused(ClientError):
    """The server would not give the session back (or it did not answer
    ``session.resume`` as the protocol says): do not try again."""


class State(enum.Enum):
    CONNECTING = "connecting"
    OPEN = "open"
    #: the connection dropped; the reader is taking the session back on a
    #: new one (``auto_resume``): text is held, other sends wait
    RESUMING = "resuming"
    #: ``finish()`` sent ``session.close``: the server speaks what was flushed,
    #: then closes; only ``cancel``, ``playback`` and ``ping`` may still be sent
    CLOSING = "closing"
    CLOSED = "closed"


#: what a client may still send after ``session.close``
_WHILE_CLOSING = (Cancel, Playback, Ping)


@dataclass(frozen=True)
class AudioFrame:
    """One binary audio message, attributed to its context and sentence."""

    data: bytes  #: payload only (the tagged header removed)
    context_id: str | None
    utterance_index: int
    sentence_index: int
    sample_rate: int
    encoding: str
    received_at: float  #: ``time.perf_counter()`` when the reader took it off the socket
    header: TaggedHeader | None = None  #: under ``framing: "tagged"``

    @property
    def is_wav_header(self) -> bool:
        return self.header is not None and self.header.is_wav_header


@dataclass(frozen=True)
class FailedText:
    """Text accepted by the client for an utterance that never finished."""

    context_id: str | None
    text: str


@dataclass(frozen=True)
class Disconnected:
    """The last event of a connection."""

    code: int | None
    reason: str
    failed: list[FailedText] = field(default_factory=list)
    received_at: float = 0.0


Event = ServerMessage | AudioFrame | Disconnected


class Client:
    """One session on the gateway's streaming endpoint.  Create with ``connect``."""

    def __init__(
        self,
        url: str,
        config: SessionConfig,
        *,
        max_queued: int = DEFAULT_MAX_QUEUED,
        headers: dict[str, str] | None = None,
        open_timeout_s: float = 30.0,
        auto_resume: bool = True,
    ) -> None:
        self.url = url
        #: resume a dropped connection by itself (protocol 2.1.0)
        self.auto_resume = auto_resume
        self.requested_config = config
        self.max_queued = max_queued
        self.headers = headers or {}
        self.open_timeout_s = open_timeout_s
        #: the local address to connect from (``127.0.0.x`` in the benchmark's
        #: overload scenario, so the server sees several clients); None: any
        self.local_host: str | None = None
        self.state = State.CONNECTING
        self.session: SessionCreated | None = None
        self.config: EffectiveConfig | None = None
        self._ws: ClientConnection | None = None
        self._queue: asyncio.Queue[Event] = asyncio.Queue(max_queued)
        self._reader: asyncio.Task[None] | None = None
        # routing binary messages to their sentence
        self._raw_current: AudioStart | None = None
        self._tagged: dict[int, AudioStart] = {}
        self._disconnected: Disconnected | None = None
        self._config_waiters: list[asyncio.Future[SessionUpdated | Error]] = []
        #: for resume: binary messages received per context, JSON messages
        #: since this connection's session.created (or session.resumed), and
        #: the text of utterances without session.done (failed on loss)
        self._tracker = ResumeTracker()
        #: set and replaced whenever ``state`` or the connection changes
        self._changed = asyncio.Event()
        #: resumes that took the session back, and the latest answer
        self.resumes = 0
        self.last_resumed: SessionResumed | None = None

    # --- lifecycle ------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        url: str = DEFAULT_URL,
        config: SessionConfig | None = None,
        *,
        voice: str | None = None,
        api_key: str | None = None,
        max_queued: int = DEFAULT_MAX_QUEUED,
        open_timeout_s: float = 30.0,
        local_host: str | None = None,
        auto_resume: bool = True,
    ) -> Client:
        """Open a session and apply ``config`` (default ``LOW_LATENCY``);
        ``local_host``: connect from this local address; ``auto_resume``:
        take the session back by itself when the connection drops."""
        config = msgspec.structs.replace(config or LOW_LATENCY)
        if voice is not None:
            config = msgspec.structs.replace(config, voice=voice)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        client = cls(
            url,
            config,
            max_queued=max_queued,
            headers=headers,
            open_timeout_s=open_timeout_s,
            auto_resume=auto_resume,
        )
        client.local_host = local_host
        await client._open()
        return client

    async def _open(self) -> None:
        self.state = State.CONNECTING
        self._queue = asyncio.Queue(self.max_queued)
        self._raw_current = None
        self._tagged = {}
        self._disconnected = None
        self._tracker.new_session()
        async with asyncio.timeout(self.open_timeout_s):
            self._ws = await self._connect()
            first = server_decoder.decode(await self._ws.recv())
            if isinstance(first, Error):
                await self._ws.close()
                self.state = State.CLOSED
                raise ClientError(f"refused: {first.code}: {first.message}")
            if not isinstance(first, SessionCreated):
                raise ClientError(f"expected session.created, got {type(first).__name__}")
            self._attach(first)
            self._set_state(State.OPEN, self._ws)
            self._reader = asyncio.create_task(self._read(), name="gateway-client-reader")
            await self.configure(self.requested_config)

    def _attach(self, created: SessionCreated) -> None:
        self.session = created
        self.config = created.defaults
        self._tracker.created(created.resume_token, created.resume_window_s)
        self._tracker.tagged = created.defaults.framing == "tagged"

    def _set_state(self, state: State, ws: ClientConnection | None = None) -> None:
        """Change ``state`` (and the connection) and wake whoever waits on it."""
        self.state = state
        if ws is not None or state is State.RESUMING:
            self._ws = ws
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            await self._changed.wait()

    async def _connect(self, url: str | None = None) -> ClientConnection:
        # no deflate: audio does not compress, and it would cost latency
        return await connect(
            url or self.url,
            max_size=None,
            compression=None,
            additional_headers=self.headers,
            max_queue=16,
            # passed on to loop.create_connection
            local_addr=None if self.local_host is None else (self.local_host, 0),
        )

    async def resume(self) -> SessionResumed:
        """Take the session back on a new connection after the old one
        dropped (protocol 2.1.0, within the server's ``resume_window_s``),
        for a client made with ``auto_resume=False`` (one with it resumes by
        itself): its config, contexts and text stay, the text the server
        does not hold is sent again, and ``events()`` goes on where it
        stopped, with no frame repeated or skipped (iterate it again after
        its ``Disconnected``).  ``ClientError`` when refused (expired,
        unknown): then ``reconnect()`` starts a new session."""
        if self._tracker.token is None:
            raise ClientError("this server does not resume sessions; reconnect() instead")
        await self.aclose(send_close=False)
        try:
            async with asyncio.timeout(self.open_timeout_s):
                ws, created, answer = await self._resume_handshake()
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise ClientError(f"resume failed: {type(exc).__name__}: {exc}") from exc
        self._disconnected = None
        self._set_state(State.RESUMING)
        self._reader = asyncio.create_task(
            self._read(taken_back=(ws, created, answer)), name="gateway-client-reader"
        )
        return answer[0]

    async def _resume_handshake(
        self,
    ) -> tuple[ClientConnection, SessionCreated, tuple[SessionResumed, Resumed]]:
        """A new connection and its ``session.resume``: the new
        ``session.created`` and ``session.resumed``.  ``ResumeRefused`` when
        refused; connection errors as they come (worth another try)."""
        ws = await self._connect(resume_url(self.url, self._tracker.token))
        try:
            first = server_decoder.decode(await ws.recv())  # the new connection's own session
            if isinstance(first, Error):
                raise ConnectionError(f"{first.code}: {first.message}")  # busy: try again
            await ws.send(msgspec.json.encode(self._tracker.resume_message()).decode())
            created = server_decoder.decode(await ws.recv())
            if isinstance(created, Error):
                raise ResumeRefused(f"resume refused: {created.code}: {created.message}", created)
            raw = await ws.recv()
            resumed = server_decoder.decode(raw)
            if not isinstance(created, SessionCreated) or not isinstance(resumed, SessionResumed):
                raise ResumeRefused("unexpected answer to session.resume")
        except BaseException:
            await ws.close()
            raise
        self._tracker.created(created.resume_token, created.resume_window_s)
        return ws, created, (resumed, self._tracker.resumed(msgspec.json.decode(raw)))

    async def reconnect(self) -> list[FailedText]:
        """Open a new session with the same config.  Returns the text of
        utterances that had not finished on the old one: it is not re-sent."""
        failed = self._disconnected.failed if self._disconnected else self._failed_now()
        await self.aclose(send_close=False)
        await self._open()
        return failed

    async def finish(self) -> float:
        """End the session politely: ``session.close``.  The server speaks
        what was flushed (``done()``, ``flush()``) and reports text never
        flushed as unspoken, then closes with 1000: keep reading
        ``events()`` until ``Disconnected``.  ``cancel()`` and ``playback()``
        still work meanwhile; ``aclose()`` stops at once.  Returns the
        ``perf_counter`` time it was sent."""
        if self.state is State.CLOSING:
            return time.perf_counter()  # sent already
        await self._send(SessionClose())
        if self.state is State.OPEN:  # the reader may have seen the close already
            self._set_state(State.CLOSING)
        return time.perf_counter()

    async def aclose(self, *, send_close: bool = True) -> None:
        """Stop now and close the socket: ``cancel`` of every context, then
        ``session.close`` (unless told not to send either).  Since protocol
        2.0.0 ``session.close`` alone would let the server finish what was
        flushed; ``finish()`` is that polite end."""
        ws = self._ws
        if ws is not None and self.state in (State.OPEN, State.CLOSING) and send_close:
            with contextlib.suppress(ConnectionClosed):
                await ws.send(encode_text(Cancel(context_id="*")))
                if self.state is State.OPEN:
                    await ws.send(encode_text(SessionClose()))
        self._set_state(State.CLOSED)
        if ws is not None:
            await ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- sending --------------------------------------------------------------

    def _check_sendable(self, message: ClientMessage) -> None:
        if self.state is State.CLOSING and not isinstance(message, _WHILE_CLOSING):
            raise ClientError(
                "the session is closing (finish() sent session.close); only cancel,"
                " playback and ping may still be sent"
            )
        if self.state not in (State.OPEN, State.CLOSING, State.RESUMING):
            raise ClientError("the connection is closed; reconnect() starts a new session")

    def _may_resume(self) -> bool:
        """Whether a connection that fails now may still be resumed (the
        reader decides once it sees the close)."""
        return self.auto_resume and self.state is State.OPEN and self._tracker.can_resume(None)

    async def _send(self, message: ClientMessage) -> None:
        """Send now; while the session is being resumed, once it is back."""
        while True:
            self._check_sendable(message)
            ws = self._ws
            if self.state is State.RESUMING or ws is None:
                await self._wait_until(lambda: self.state is not State.RESUMING)
                continue
            try:
                await ws.send(encode_text(message))
                return
            except ConnectionClosed as exc:
                if not self._may_resume():
                    raise ClientError(f"connection lost: {exc}") from exc
            # the reader resumes or ends the session: wait for its decision
            await self._wait_until(functools.partial(self._replaced, ws))

    def _replaced(self, ws: ClientConnection) -> bool:
        """The reader has seen ``ws`` close: resuming, back, or ended."""
        return self._ws is not ws or self.state is State.CLOSED

    async def _send_input(self, message: InputText | InputDone) -> None:
        """Text and ``input.done``: given while the session is being
        resumed, they are held and sent after it (only what the server
        lacks, ``session.resumed``)."""
        self._check_sendable(message)
        ws = self._ws
        sent = False
        if self.state is not State.RESUMING and ws is not None:
            try:
                await ws.send(encode_text(message))
                sent = True
            except ConnectionClosed as exc:
                if not self._may_resume():
                    raise ClientError(f"connection lost: {exc}") from exc
        if isinstance(message, InputText):
            self._tracker.text(message.context_id, message.text, sent=sent)
        else:
            self._tracker.done(message.context_id, sent=sent)

    async def configure(self, config: SessionConfig, timeout_s: float = 10.0) -> EffectiveConfig:
        """Send a ``session.config`` and wait for its ``session.updated``.

        Raises ``ClientError`` with the server's message when it is rejected.
        The answer is also delivered to ``events()`` like every other event.
        """
        waiter: asyncio.Future[SessionUpdated | Error] = asyncio.get_running_loop().create_future()
        self._config_waiters.append(waiter)
        await self._send(config)
        async with asyncio.timeout(timeout_s):
            answer = await waiter
        if isinstance(answer, Error):
            raise ClientError(f"config rejected: {answer.code}: {answer.message}")
        self.config = answer.config
        return answer.config

    async def send_text(self, text: str, context_id: str | None = None) -> float:
        """Send one text increment; returns the ``perf_counter`` time it was sent."""
        await self._send_input(InputText(text=text, context_id=context_id))
        return time.perf_counter()

    async def flush(self, context_id: str | None = None) -> float:
        await self._send(InputFlush(context_id=context_id))
        return time.perf_counter()

    async def done(self, context_id: str | None = None) -> float:
        """End the utterance (``input.done``): what is buffered is spoken."""
        await self._send_input(InputDone(context_id=context_id))
        return time.perf_counter()

    async def cancel(self, context_id: str | None = None) -> float:
        """Barge-in: ``"*"`` cancels every context.  The report arrives as
        ``AudioCancelled`` and ``SessionDone(cancelled=True)``."""
        self._check_sendable(Cancel(context_id=context_id))
        self._tracker.cancel(context_id)  # never sent again on a resume
        await self._send(Cancel(context_id=context_id))
        return time.perf_counter()

    async def playback(self, played_ms: float, context_id: str | None = None) -> None:
        """Report the listener's position (for ``flow_control: "ack"``)."""
        await self._send(Playback(played_ms=played_ms, context_id=context_id))

    async def ping(self, ping_id: str | int | None = None) -> None:
        await self._send(Ping(id=ping_id))

    # --- receiving ------------------------------------------------------------

    async def events(self) -> AsyncIterator[Event]:
        """Every event in arrival order; ends after ``Disconnected``."""
        while True:
            item = await self._queue.get()
            yield item
            if isinstance(item, Disconnected):
                return

    async def next_event(self, timeout_s: float | None = None) -> Event:
        async with asyncio.timeout(timeout_s):
            return await self._queue.get()

    async def speak(
        self, text: str, context_id: str | None = None, timeout_s: float = 120.0
    ) -> tuple[bytes, SessionDone]:
        """Speak ``text`` as one utterance; return its audio and ``session.done``.

        Only for a context with nothing else in flight (other events are skipped).
        """
        await self.send_text(text, context_id)
        await self.done(context_id)
        audio = bytearray()
        async with asyncio.timeout(timeout_s):
            async for event in self.events():
                match event:
                    case AudioFrame(context_id=ctx) if ctx == context_id:
                        if not event.is_wav_header:
                            audio += event.data
                    case SessionDone(context_id=ctx) if ctx == context_id:
                        return bytes(audio), event
                    case Error(fatal=True):
                        raise ClientError(f"{event.code}: {event.message}")
                    case Disconnected():
                        raise ClientError(f"connection lost: {event.reason}")
        raise ClientError("connection ended")

    @property
    def queued(self) -> int:
        """Items waiting for the caller (bounded by ``max_queued``)."""
        return self._queue.qsize()

    def _failed_now(self) -> list[FailedText]:
        return [
            FailedText(context_id=ctx, text=text)
            for ctx, text in self._tracker.unfinished().items()
        ]

    async def _read(
        self,
        taken_back: tuple[ClientConnection, SessionCreated, tuple[SessionResumed, Resumed]]
        | None = None,
    ) -> None:
        """Read connection after connection: a dropped one is resumed
        (``auto_resume``), until one ends for good (``Disconnected``)."""
        code: int | None = None
        reason = ""
        try:
            if taken_back is not None:  # resume(): the handshake is done
                reason = await self._take_back(*taken_back) or ""
                if reason:
                    return
            while True:
                ws = self._ws
                assert ws is not None
                code, reason = await self._read_connection(ws)
                if not (
                    self.auto_resume and self.state is State.OPEN and self._tracker.can_resume(code)
                ):
                    return
                why = await self._auto_resume()
                if why is not None:
                    reason = why
                    return
        finally:
            self._ended(code, reason)

    async def _read_connection(self, ws: ClientConnection) -> tuple[int | None, str]:
        """Hand on every message of ``ws``; its close code and reason."""
        try:
            async for message in ws:
                await self._handle(message)
        except ConnectionClosed:
            pass  # the close code is read below
        return ws.close_code, ws.close_reason or ""

    async def _handle(self, message: str | bytes) -> None:
        now = time.perf_counter()
        if isinstance(message, bytes):
            frame = self._frame(message, now)
            if frame is not None:
                await self._queue.put(frame)
            return
        event = self._event(message)
        if event is not None:
            await self._queue.put(event)

    async def _auto_resume(self) -> str | None:
        """Take the session back on a new connection, trying again while the
        window lasts; None when it is back, else why not."""
        self._set_state(State.RESUMING)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._tracker.window_s - WINDOW_MARGIN_S
        attempt = 0
        while True:
            delay = retry_delay_s(attempt)
            attempt += 1
            if loop.time() + delay >= deadline:
                return f"not resumed within resume_window_s ({self._tracker.window_s:g} s)"
            await asyncio.sleep(delay)
            try:
                async with asyncio.timeout(min(self.open_timeout_s, deadline - loop.time())):
                    ws, created, answer = await self._resume_handshake()
            except ResumeRefused as exc:
                return str(exc)
            except msgspec.DecodeError as exc:  # not the protocol's answer
                return f"unexpected answer to session.resume: {exc}"
            except (OSError, TimeoutError, WebSocketException):
                continue  # the network or the server is not back yet
            why = await self._take_back(ws, created, answer)
            if why != "dropped":
                return why

    async def _take_back(
        self, ws: ClientConnection, created: SessionCreated, answer: tuple[SessionResumed, Resumed]
    ) -> str | None:
        """On the resumed connection: hand on the messages sent again, send
        the text the server lacks, then go on.  None when done; ``"dropped"``
        when this connection dropped too (try again)."""
        resumed, plan = answer
        self.session = created
        self.config = created.defaults
        self._ws = ws
        try:
            for _ in range(plan.replayed_messages):
                await self._handle(await ws.recv())
            messages = self._tracker.resend(plan)
            while messages:
                for message in messages:
                    await ws.send(msgspec.json.encode(message).decode())  # a text frame
                # text given while these went out: after them, in order
                messages = self._tracker.ledger.unsent()
        except ConnectionClosed:
            if self._tracker.can_resume(ws.close_code):
                return "dropped"
            return f"resumed connection closed ({ws.close_code})"
        self.resumes += 1
        self.last_resumed = resumed
        self._set_state(State.OPEN, ws)
        return None

    def _ended(self, code: int | None, reason: str) -> None:
        self._set_state(State.CLOSED)
        for waiter in self._config_waiters:
            if not waiter.done():
                waiter.set_exception(ClientError(f"connection closed ({code})"))
        self._config_waiters.clear()
        self._disconnected = Disconnected(
            code=code, reason=reason, failed=self._failed_now(), received_at=time.perf_counter()
        )
        # The caller may have stopped iterating: never block a closing reader.
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(self._disconnected)

    def _event(self, message: str | bytes) -> ServerMessage | None:
        try:
            event = server_decoder.decode(message)
        except msgspec.ValidationError:
            self._tracker.event(None)  # counted all the same (session.resume)
            return None  # an unknown type from a newer server: ignore it
        tag = type(event).__struct_config__.tag
        self._tracker.event(
            tag if isinstance(tag, str) else None,
            getattr(event, "context_id", None),
            context_number=event.context_number if isinstance(event, AudioStart) else None,
            fatal=isinstance(event, Error) and event.fatal,
        )
        match event:
            case AudioStart():
                if self.config is not None and self.config.framing == "tagged":
                    self._tagged[event.context_number] = event
                else:
                    self._raw_current = event
            case AudioDone():
                if (
                    self._raw_current is not None
                    and self._raw_current.context_id == event.context_id
                ):
                    self._raw_current = None
            case SessionUpdated():
                self._tracker.tagged = event.config.framing == "tagged"
                if self._config_waiters:
                    self._config_waiters.pop(0).set_result(event)
            case Error(code="invalid_config" | "unknown_voice" | "unsupported_option"):
                if self._config_waiters:
                    self._config_waiters.pop(0).set_result(event)
            case Error(code="invalid_state") if "`framing`" in event.message:
                if self._config_waiters:
                    self._config_waiters.pop(0).set_result(event)
        return event

    def _frame(self, message: bytes, now: float) -> AudioFrame | None:
        header: TaggedHeader | None = None
        payload: bytes = message
        if self.config is not None and self.config.framing == "tagged":
            header, view = unpack_frame(message)
            payload = bytes(view)
            start = self._tagged.get(header.context)
            self._tracker.binary(header.context)  # counted for session.resume
        else:
            start = self._raw_current
            self._tracker.binary()
        if start is None:
            return None  # audio without an audio.start breaks the contract; drop it
        return AudioFrame(
            data=payload,
            context_id=start.context_id,
            utterance_index=start.utterance_index,
            sentence_index=start.sentence_index,
            sample_rate=start.sample_rate,
            encoding=start.encoding,
            received_at=now,
            header=header,
        )


def frame_ms(frame: AudioFrame) -> float:
    """Duration of a frame's audio in milliseconds (WAV header messages: 0)."""
    if frame.is_wav_header:
        return 0.0
    width = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1, "alaw": 1}[frame.encoding]
    return len(frame.data) / width / frame.sample_rate * 1000.0
