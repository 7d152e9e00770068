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

Reconnects: a connection is one session.  When it is lost, text sent for
utterances that had not finished (no ``session.done``) is reported in
``Disconnected.failed``; ``reconnect()`` opens a new session with the same
config and never re-sends anything.  This module must not retry on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import msgspec
from voice_gateway_wire.frames import TaggedHeader, unpack_frame
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

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
    ReceivedMessages,
    ServerMessage,
    SessionClose,
    SessionConfig,
    SessionCreated,
    SessionDone,
    SessionResume,
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


def resume_url(url: str, token: str) -> str:
    """``url`` with ``resume=<the gateway id>`` (the token's prefix, protocol
    2.2.0), for a proxy to route the resume to the gateway that issued the
    token (docs/deployment.md); the token itself stays out of the URL."""
    issuer, dot, _ = token.rpartition(".")
    if not dot:
        return url  # a 2.1.0 server's token names no gateway
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "resume"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("resume", issuer)])))


class ClientError(Exception):
    """The server refused the session or config, or the connection is gone.

    ``error``: the server's ``error`` event when it said why (a refused
    ``resume()``: on ``resume_expired``, its ``unspoken`` is the text not
    heard, to send again on a new session)."""

    def __init__(self, message: str, error: Error | None = None) -> None:
        super().__init__(message)
        self.error = error


class State(enum.Enum):
    CONNECTING = "connecting"
    OPEN = "open"
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
    ) -> None:
        self.url = url
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
        # text of utterances without session.done, per context: failed on loss
        self._pending: dict[str | None, list[str]] = {}
        self._disconnected: Disconnected | None = None
        self._config_waiters: list[asyncio.Future[SessionUpdated | Error]] = []
        #: for ``resume``: binary messages handed on per context (every one
        #: under context None with raw framing), and JSON messages handed on
        #: since this connection's session.created (or session.resumed)
        self._received: dict[str | None, int] = {}
        self._events = 0

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
    ) -> Client:
        """Open a session and apply ``config`` (default ``LOW_LATENCY``);
        ``local_host``: connect from this local address."""
        config = msgspec.structs.replace(config or LOW_LATENCY)
        if voice is not None:
            config = msgspec.structs.replace(config, voice=voice)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        client = cls(
            url, config, max_queued=max_queued, headers=headers, open_timeout_s=open_timeout_s
        )
        client.local_host = local_host
        await client._open()
        return client

    async def _open(self) -> None:
        self.state = State.CONNECTING
        self._queue = asyncio.Queue(self.max_queued)
        self._raw_current = None
        self._tagged = {}
        self._pending = {}
        self._disconnected = None
        self._received = {}
        self._events = 0
        async with asyncio.timeout(self.open_timeout_s):
            self._ws = await self._connect()
            first = server_decoder.decode(await self._ws.recv())
            if isinstance(first, Error):
                await self._ws.close()
                self.state = State.CLOSED
                raise ClientError(f"refused: {first.code}: {first.message}")
            if not isinstance(first, SessionCreated):
                raise ClientError(f"expected session.created, got {type(first).__name__}")
            self.session = first
            self.config = first.defaults
            self.state = State.OPEN
            self._reader = asyncio.create_task(self._read(), name="gateway-client-reader")
            await self.configure(self.requested_config)

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
        dropped (protocol 2.1.0, within the server's ``resume_window_s``):
        its config, contexts and text stay, and ``events()`` goes on where it
        stopped, with no frame repeated or skipped (iterate it again after
        its ``Disconnected``).  ``ClientError`` when refused (expired,
        unknown): then ``reconnect()`` starts a new session."""
        token = self.session.resume_token if self.session is not None else None
        if token is None:
            raise ClientError("this server does not resume sessions; reconnect() instead")
        # the old connection's reader stops first: until then it may still
        # hand on frames the dropped socket had buffered, and the counts
        # must include every one of them (else they would come twice)
        await self.aclose(send_close=False)
        request = SessionResume(
            resume_token=token,
            received=[
                ReceivedMessages(context_id=c, messages=n) for c, n in self._received.items()
            ],
            events=self._events,
        )
        async with asyncio.timeout(self.open_timeout_s):
            ws = await self._connect(resume_url(self.url, token))
            try:
                server_decoder.decode(await ws.recv())  # the new connection's own session
                await ws.send(encode_text(request))
                created = server_decoder.decode(await ws.recv())
                if isinstance(created, Error):
                    raise ClientError(f"resume refused: {created.code}: {created.message}", created)
                resumed = server_decoder.decode(await ws.recv())
            except (ClientError, ConnectionClosed):
                await ws.close()
                raise
        if not isinstance(created, SessionCreated) or not isinstance(resumed, SessionResumed):
            await ws.close()
            raise ClientError("unexpected answer to session.resume")
        self._ws = ws
        self.session = created
        self.config = created.defaults
        self._events = 0
        self._disconnected = None
        self.state = State.OPEN
        self._reader = asyncio.create_task(self._read(), name="gateway-client-reader")
        return resumed

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
            self.state = State.CLOSING
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
        self.state = State.CLOSED
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

    async def _send(self, message: ClientMessage) -> None:
        if self.state is State.CLOSING and not isinstance(message, _WHILE_CLOSING):
            raise ClientError(
                "the session is closing (finish() sent session.close); only cancel,"
                " playback and ping may still be sent"
            )
        if self.state not in (State.OPEN, State.CLOSING) or self._ws is None:
            raise ClientError("the connection is closed; reconnect() starts a new session")
        try:
            await self._ws.send(encode_text(message))
        except ConnectionClosed as exc:
            raise ClientError(f"connection lost: {exc}") from exc

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
        await self._send(InputText(text=text, context_id=context_id))
        self._pending.setdefault(context_id, []).append(text)
        return time.perf_counter()

    async def flush(self, context_id: str | None = None) -> float:
        await self._send(InputFlush(context_id=context_id))
        return time.perf_counter()

    async def done(self, context_id: str | None = None) -> float:
        """End the utterance (``input.done``): what is buffered is spoken."""
        await self._send(InputDone(context_id=context_id))
        self._pending.setdefault(context_id, [])
        return time.perf_counter()

    async def cancel(self, context_id: str | None = None) -> float:
        """Barge-in: ``"*"`` cancels every context.  The report arrives as
        ``AudioCancelled`` and ``SessionDone(cancelled=True)``."""
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
            FailedText(context_id=ctx, text="".join(parts))
            for ctx, parts in self._pending.items()
            if parts
        ]

    async def _read(self) -> None:
        assert self._ws is not None
        ws = self._ws
        code: int | None = None
        reason = ""
        try:
            async for message in ws:
                now = time.perf_counter()
                if isinstance(message, bytes):
                    frame = self._frame(message, now)
                    if frame is not None:
                        await self._queue.put(frame)
                        # counted once handed on (a resume's ``received``)
                        key = frame.context_id if frame.header is not None else None
                        self._received[key] = self._received.get(key, 0) + 1
                    continue
                event = self._event(message)
                if event is not None:
                    await self._queue.put(event)
                self._events += 1
        except ConnectionClosed:
            pass  # the close code is read below
        finally:
            if ws.close_code is not None:
                code = ws.close_code
                reason = ws.close_reason or ""
            self.state = State.CLOSED
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
            return None  # an unknown type from a newer server: ignore it
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
            case SessionDone():
                self._pending.pop(event.context_id, None)
            case SessionUpdated():
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
        else:
            start = self._raw_current
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
