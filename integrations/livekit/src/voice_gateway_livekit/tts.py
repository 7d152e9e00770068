"""``TTS``: a LiveKit Agents text-to-speech plugin for the voice gateway.

Shaped like LiveKit's own WebSocket plugins (Cartesia's): sockets live in a
``utils.ConnectionPool`` and each ``SynthesizeStream`` (one agent turn)
borrows one, speaks in one gateway context of its own and gives the socket
back.  Tokens go out as ``input.text`` as they are pushed; ``flush()`` (or
``end_input()``) sends ``input.done``; the gateway's ``session.done`` ends
the segment.  A turn interrupted by the framework (``aclose()`` cancels the
stream) sends ``cancel`` for its context and returns the still-open socket
to the pool, so the next turn reuses a warm connection; audio of the
cancelled context still in flight is told apart by its tagged context
number and dropped.

Every session is configured for PCM s16le at the TTS's ``sample_rate``,
20 ms frames, ``framing: "tagged"``, ``flow_control: "realtime"`` and word
timings, which become ``TimedString`` transcripts.  Failures are LiveKit's
``APIConnectionError`` / ``APIStatusError`` / ``APITimeoutError``, so its
retries and ``FallbackAdapter`` apply.

Resume (protocol 2.1.0, ``resume=True`` by default): when a turn's socket
drops (no close frame, or a proxy's 1012-1014), the turn reconnects at once
and takes the same gateway session back with ``session.resume`` within the
gateway's ``resume_window_s`` (tries bounded by it): the audio continues
where it stopped, tokens pushed meanwhile are held and sent after it (only
what the gateway lacks).  The bookkeeping is ``voice_gateway_wire.resume``,
shared with the gateway's Python client and the Pipecat plugin.  Refused or
past the window, the turn fails with ``APIConnectionError`` as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import aiohttp
from livekit.agents import (
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APIStatusError,
    APITimeoutError,
    tts,
    utils,
)
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, TimedString
from voice_gateway_wire.errors import error_status
from voice_gateway_wire.frames import unpack_frame
from voice_gateway_wire.resume import WINDOW_MARGIN_S, ResumeTracker, resume_url, retry_delay_s
from voice_gateway_wire.session import (
    ProtocolMismatch,
    check_protocol_version,
    engine_gives_word_timings,
    resolve_language,
    session_config,
)

logger = logging.getLogger("voice_gateway_livekit")

DEFAULT_URL = "ws://127.0.0.1:8000/v1/audio/speech/stream"
#: LiveKit's usual TTS rate; the gateway resamples from the voice's own
DEFAULT_SAMPLE_RATE = 24000
#: seconds between WebSocket ping frames on a pooled socket; the gateway
#: counts them as activity, so an idle socket outlives ``idle_timeout_s``
DEFAULT_HEARTBEAT_S = 10.0
#: the longest a cancelled turn waits to send its ``cancel``
CANCEL_SEND_TIMEOUT_S = 2.0


@dataclass
class _Options:
    url: str
    api_key: str | None
    sample_rate: int
    voice: str | None
    speed: float | None
    language: str | None
    max_lead_ms: int | None


class GatewayConnection:
    """One pooled gateway session: its WebSocket (a new one after a resume),
    what its ``session.created`` said, and its resume bookkeeping."""

    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        created: dict[str, Any],
        tracker: ResumeTracker | None = None,
    ) -> None:
        self.ws = ws
        self.created = created
        self.session_id = str(created.get("session_id", ""))
        self.tracker = tracker or ResumeTracker()
        #: when the socket dropped while the session may be resumed
        #: (monotonic); None while connected
        self.dropped_at: float | None = None

    def send_failed(self) -> bool:
        """A send failed: True when the session may be resumed (the socket
        dropped), so what was sent is held for the resume."""
        return self.dropped(self.ws.close_code)

    def dropped(self, close_code: int | None) -> bool:
        """The socket closed with ``close_code``: True when the session may
        be resumed (the window opens at the first call)."""
        if self.dropped_at is None and self.tracker.can_resume(close_code):
            self.dropped_at = time.monotonic()
        return self.resuming

    @property
    def resuming(self) -> bool:
        return self.dropped_at is not None

    @property
    def deadline(self) -> float:
        assert self.dropped_at is not None
        return self.dropped_at + self.tracker.window_s - WINDOW_MARGIN_S


class TTS(tts.TTS[Literal["metrics_collected", "error"]]):
    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        voice: str | None = None,
        speed: float | None = None,
        language: str | None = None,
        sample_rate: int = DEFAULT_SAMPLE_RATE,
        max_lead_ms: int | None = None,
        aligned_transcript: bool = True,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        http_session: aiohttp.ClientSession | None = None,
        resume: bool = True,
    ) -> None:
        """Create the plugin.

        Args:
            url: The gateway's ``/v1/audio/speech/stream`` WebSocket URL.
            api_key: Sent as ``Authorization: Bearer``; use an agent key
                (``agent_api_keys``) for a worker running many calls.
            voice, speed, language: ``session.config`` values; ``None`` keeps
                the gateway's defaults.
            sample_rate: Output rate asked of the gateway (resampled there
                from the voice's native rate when they differ).
            max_lead_ms: ``realtime`` flow control's lead over real time.
            aligned_transcript: Word timings as ``TimedString``; set False for
                an engine that declares none (``session.created``).
            heartbeat_s: WebSocket ping interval of pooled sockets.
            http_session: aiohttp session; default the job context's.
            resume: Take the gateway session back when a turn's socket
                drops (``session.resume``, within the gateway's
                ``resume_window_s``) instead of failing the turn.
        """
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=aligned_transcript),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._opts = _Options(url, api_key, sample_rate, voice, speed, language, max_lead_ms)
        self._heartbeat_s = heartbeat_s
        self._session = http_session
        self._resume = resume
        #: sessions taken back after a dropped socket
        self.resumes = 0
        self._pool = utils.ConnectionPool[GatewayConnection](
            connect_cb=self._connect_ws,
            close_cb=self._close_ws,
        )
        self._streams = weakref.WeakSet[SynthesizeStream]()
        #: the gateway session id of the connection the last turn borrowed
        #: (the same id for two turns: they shared one warm socket)
        self.last_session_id: str | None = None

    @property
    def model(self) -> str:
        return "voice-gateway"

    @property
    def provider(self) -> str:
        return "voice-gateway"

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = utils.http_context.http_session()
        return self._session

    async def _open_ws(self, resume_token: str | None = None) -> aiohttp.ClientWebSocketResponse:
        """A new socket (``resume_token``: to resume, the URL names the
        token's gateway for a proxy: ``?resume=<gateway id>``)."""
        headers = {"Authorization": f"Bearer {self._opts.api_key}"} if self._opts.api_key else {}
        return await self._ensure_session().ws_connect(
            resume_url(self._opts.url, resume_token),
            headers=headers,
            heartbeat=self._heartbeat_s,
            max_msg_size=0,
            compress=0,
        )

    # the signature is ConnectionPool's connect_cb: it passes the timeout
    async def _connect_ws(self, timeout: float) -> GatewayConnection:  # noqa: ASYNC109
        try:
            async with asyncio.timeout(timeout):
                ws = await self._open_ws()
                try:
                    return await self._handshake(ws)
                except BaseException:
                    await ws.close()
                    raise
        except TimeoutError:
            raise APITimeoutError("voice gateway connect timed out") from None
        except aiohttp.ClientResponseError as e:
            raise APIStatusError(message=e.message, status_code=e.status) from None
        except (APIError, ProtocolMismatch):
            raise
        except Exception as e:
            # transport errors may carry URLs with credentials: name the type only
            raise APIConnectionError(f"voice gateway unreachable: {type(e).__name__}") from None

    async def _handshake(self, ws: aiohttp.ClientWebSocketResponse) -> GatewayConnection:
        created = await _receive_json(ws)
        _raise_if_error(created)
        try:
            check_protocol_version(created)
        except ProtocolMismatch as e:
            raise APIStatusError(str(e), status_code=505, retryable=False) from None
        if self.capabilities.aligned_transcript and not engine_gives_word_timings(created):
            logger.warning("the gateway's engine gives no word timings: no aligned transcript")
        config = session_config(
            sample_rate=self._opts.sample_rate,
            voice=self._opts.voice,
            speed=self._opts.speed,
            language=resolve_language(self._opts.language, created, self._opts.voice),
            timestamps=self.capabilities.aligned_transcript,
            max_lead_ms=self._opts.max_lead_ms,
        )
        tracker = ResumeTracker()
        if self._resume:
            tracker.created_message(created)
        await ws.send_str(json.dumps(config))
        while True:
            reply = await _receive_json(ws)
            tracker.event_message(reply)  # counted for session.resume
            _raise_if_error(reply)
            if reply.get("type") == "session.updated":
                return GatewayConnection(ws, created, tracker)

    async def _resume_session(
        self, conn: GatewayConnection, handle: Callable[[aiohttp.WSMessage], None]
    ) -> None:
        """Take ``conn``'s session back on a new socket: at once, then again
        with a growing wait until the window ends.  The messages sent again
        go to ``handle``, then the text the gateway lacks goes out.
        ``APIConnectionError`` when refused or out of time (the turn fails,
        as it did before resume)."""
        tracker = conn.tracker
        attempt = 0
        while True:
            delay = retry_delay_s(attempt)
            attempt += 1
            if time.monotonic() + delay >= conn.deadline:
                raise APIConnectionError(
                    "voice gateway connection lost and not resumed within resume_window_s"
                    f" ({tracker.window_s:g} s)"
                )
            await asyncio.sleep(delay)
            try:
                async with asyncio.timeout(max(0.1, conn.deadline - time.monotonic())):
                    ws = await self._open_ws(tracker.token)
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                logger.debug("resume: gateway not reachable yet: %r", e)
                continue
            try:
                own = await _receive_json(ws)  # the new connection's own session
                if own.get("type") == "error":
                    raise APIConnectionError(f"voice gateway busy: {own.get('code')}")
                await ws.send_str(json.dumps(tracker.resume_message()))
                created = await _receive_json(ws)
                if created.get("type") == "error":
                    code = created.get("code")
                    raise APIStatusError(
                        f"voice gateway connection lost; resume refused: {code}:"
                        f" {created.get('message')}",
                        status_code=error_status(code),
                        body=created,
                    )
                tracker.created_message(created)
                answer = tracker.resumed(await _receive_json(ws))
                for _ in range(answer.replayed_messages):
                    message = await ws.receive()
                    if message.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                        raise APIConnectionError("voice gateway closed during the resume")
                    handle(message)
                messages = tracker.resend(answer)
                while messages:
                    for message_out in messages:
                        await ws.send_str(json.dumps(message_out))
                    messages = tracker.ledger.unsent()  # pushed meanwhile
            except APIStatusError:
                await ws.close()
                raise
            except (APIConnectionError, aiohttp.ClientError, ConnectionError) as e:
                await ws.close()
                logger.debug("resume: try %d failed: %r", attempt, e)
                continue
            except BaseException:
                await ws.close()
                raise
            conn.ws = ws
            conn.created = created
            conn.dropped_at = None
            self.resumes += 1
            logger.info("gateway session %s resumed", conn.session_id)
            return

    async def _close_ws(self, conn: GatewayConnection) -> None:
        await conn.ws.close()

    async def _acquire(self, connect_s: float) -> GatewayConnection:
        """A pooled connection that is still open (the gateway may have
        closed an idle one, e.g. on restart)."""
        while True:
            conn = await self._pool.get(timeout=connect_s)
            if not conn.ws.closed:
                return conn
            self._pool.remove(conn)

    def prewarm(self) -> None:
        self._pool.prewarm()

    def update_options(
        self,
        *,
        voice: str | None = None,
        speed: float | None = None,
        language: str | None = None,
    ) -> None:
        """Change voice, speed or language from the next turn on (pooled
        sockets carry the old config, so they are retired)."""
        self._opts = replace(
            self._opts,
            voice=voice if voice is not None else self._opts.voice,
            speed=speed if speed is not None else self._opts.speed,
            language=language if language is not None else self._opts.language,
        )
        self._pool.invalidate()

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> SynthesizeStream:
        stream = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()
        await self._pool.aclose()


class _Context:
    """One gateway context on a borrowed connection: receives its events
    and audio, ignores everything else on the socket."""

    def __init__(
        self,
        tts_: TTS,
        conn: GatewayConnection,
        emitter: tts.AudioEmitter,
        timeout: float,
        *,
        segments: bool,
    ) -> None:
        self.tts = tts_
        self.conn = conn
        self.id = utils.shortuuid()
        self.emitter = emitter
        self.timeout = timeout
        self.segments = segments
        self.number: int | None = None
        self.started = asyncio.Event()  #: some input was sent
        self.done = False

    async def send(self, message: dict[str, Any]) -> None:
        """``input.text`` / ``input.done`` of this context; held while the
        session is being resumed (sent after it, as far as the gateway lacks
        it)."""
        message["context_id"] = self.id
        sent = False
        if not self.conn.resuming:
            try:
                await self.conn.ws.send_str(json.dumps(message))
                sent = True
            except (aiohttp.ClientError, ConnectionError) as e:
                if not (self.tts._resume and self.conn.send_failed()):
                    raise APIConnectionError(
                        f"voice gateway send failed: {type(e).__name__}"
                    ) from None
        if message["type"] == "input.text":
            self.conn.tracker.text(self.id, message["text"], sent=sent)
        elif message["type"] == "input.done":
            self.conn.tracker.done(self.id, sent=sent)

    async def receive_until_done(self) -> None:
        await self.started.wait()
        while not self.done:
            ws = self.conn.ws
            try:
                msg = await ws.receive(timeout=self.timeout)
            except TimeoutError:
                raise APITimeoutError("voice gateway sent nothing in time") from None
            if msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                self.handle(msg)
                continue
            if not (self.tts._resume and self.conn.dropped(ws.close_code)):
                raise APIConnectionError(
                    f"voice gateway connection closed ({ws.close_code or msg.type.name})"
                )
            logger.warning("voice gateway connection dropped; resuming its session")
            await self.tts._resume_session(self.conn, self.handle)

    def handle(self, msg: aiohttp.WSMessage) -> None:
        """One message of the socket: this context's audio and events are
        used, every message is counted (``session.resume``)."""
        tracker = self.conn.tracker
        if msg.type == aiohttp.WSMsgType.BINARY:
            header, payload = unpack_frame(msg.data)
            tracker.binary(header.context)
            ours = header.context == self.number
            if ours and payload and not header.is_wav_header and not self.done:
                self.emitter.push(bytes(payload))
            return
        event = json.loads(msg.data)
        tracker.event_message(event)
        if event.get("type") == "error" and (
            event.get("fatal") or event.get("context_id") == self.id
        ):
            _raise_if_error(event)
        if event.get("context_id") != self.id or self.done:
            return  # another (cancelled) context's leftovers on a pooled socket
        kind = event.get("type")
        if kind == "audio.start":
            if self.number is None and self.segments:
                self.emitter.start_segment(segment_id=self.id)
            self.number = int(event["context_number"])
        elif kind == "alignment":
            self.emitter.push_timed_transcript(
                [
                    TimedString(
                        text=word["word"] + " ",
                        start_time=float(word["start_ms"]) / 1000.0,
                        end_time=float(word["end_ms"]) / 1000.0,
                    )
                    for word in event["words"]
                ]
            )
        elif kind == "session.done":
            self.done = True

    async def cancel(self) -> bool:
        """Send ``cancel`` for the context; True when the socket can be reused."""
        if self.done or not self.started.is_set():
            return not self.conn.ws.closed
        self.conn.tracker.cancel(self.id)
        if self.conn.resuming:
            return False  # the resume was given up with the turn
        try:
            async with asyncio.timeout(CANCEL_SEND_TIMEOUT_S):
                await self.conn.ws.send_str(json.dumps({"type": "cancel", "context_id": self.id}))
        except Exception as e:
            logger.debug("cancel not sent: %r", e)
            return False
        return not self.conn.ws.closed


async def _speak(
    tts_: TTS,
    conn_options: APIConnectOptions,
    emitter: tts.AudioEmitter,
    feed: Any,
    *,
    segments: bool,
) -> None:
    """Borrow a connection, run ``feed(context)`` (sending the text) beside the
    receiver, give the connection back: on success or cancellation (after a
    ``cancel``), never after an error."""
    conn = await tts_._acquire(conn_options.timeout)
    tts_.last_session_id = conn.session_id
    context = _Context(tts_, conn, emitter, conn_options.timeout, segments=segments)
    reusable = False
    try:
        sender = asyncio.create_task(feed(context))
        try:
            await asyncio.gather(sender, context.receive_until_done())
        finally:
            context.started.set()
            await utils.aio.gracefully_cancel(sender)
        reusable = True
    except asyncio.CancelledError:
        # an interrupted turn: cancel its context, keep the warm socket
        reusable = await asyncio.shield(context.cancel())
        raise
    except (APIError, ProtocolMismatch):
        raise
    except Exception as e:
        raise APIConnectionError(f"voice gateway failed: {type(e).__name__}") from e
    finally:
        if reusable:
            tts_._pool.put(conn)
        else:
            tts_._pool.remove(conn)


class ChunkedStream(tts.ChunkedStream):
    """``synthesize()``: the whole text in one gateway context."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=self._tts.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
        )

        async def feed(context: _Context) -> None:
            await context.send({"type": "input.text", "text": self._input_text})
            await context.send({"type": "input.done"})
            context.started.set()

        await _speak(self._tts, self._conn_options, output_emitter, feed, segments=False)
        output_emitter.flush()


class SynthesizeStream(tts.SynthesizeStream):
    """``stream()``: tokens go out as they are pushed; ``flush()`` ends the
    gateway utterance (one segment per stream, as LiveKit now expects)."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=self._tts.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )

        async def feed(context: _Context) -> None:
            sent_text = False
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    if sent_text:
                        break
                    continue
                self._mark_started()
                await context.send({"type": "input.text", "text": data})
                sent_text = True
                context.started.set()
            if sent_text:
                await context.send({"type": "input.done"})
            else:
                context.done = True  # nothing to say: no utterance was started
            context.started.set()

        await _speak(self._tts, self._conn_options, output_emitter, feed, segments=True)
        output_emitter.end_input()


async def _receive_json(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await ws.receive()
    if msg.type != aiohttp.WSMsgType.TEXT:
        raise APIConnectionError(f"voice gateway closed the connection ({ws.close_code})")
    event = json.loads(msg.data)
    if not isinstance(event, dict):
        raise APIConnectionError("voice gateway sent a message that is not an object")
    return event


def _raise_if_error(event: dict[str, Any]) -> None:
    if event.get("type") != "error":
        return
    code = event.get("code")
    raise APIStatusError(
        f"voice gateway error {code}: {event.get('message')}",
        status_code=error_status(code),
        body=event,
    )
