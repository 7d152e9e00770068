"""The session's one way out: serialized sends to the WebSocket.

Every JSON event and binary frame goes through ``Outbound`` so that sends
never interleave mid-message and a failed send stops the session's work
(a dead socket must not keep the engine busy).  Sends are never cancelled
half-way: producers stop instead.

Stall timeout (the policy is ``gateway.flow.stall``; the transport-specific
close is here).  uvicorn's ``websockets-sansio`` implementation applies write
backpressure: its ``send`` first awaits an ``asyncio.Event`` that the
transport clears in ``pause_writing`` (write buffer over its high-water mark)
and sets in ``resume_writing``, and only then serializes and writes the whole
frame synchronously.  A send blocked for ``stall_timeout_s`` is therefore
blocked *before* any byte of its frame was written, and cancelling that wait
cuts nothing half-way.  The connection is then closed with 4008 and the
transport aborted after ``STALL_CLOSE_TIMEOUT_S``:

* the ASGI ``websocket.close`` message would itself wait for the buffer to
  drain (forever, for a client that stopped reading), so the close frame is
  written directly, the way uvicorn's own keepalive timeout does it
  (``conn.fail`` + ``transport.write`` + ``close_sent``);
* the transport is reached through ``TransportMiddleware``: at the outermost
  ASGI layer uvicorn's ``send`` is the bound method
  ``WebSocketsSansIOProtocol.send``, whose ``__self__`` owns ``transport``
  and the sans-I/O ``conn``.  The middleware stores that protocol object in
  the scope (``SCOPE_KEY``); Starlette's own layers wrap ``send``, so the
  endpoint cannot reach it any other way.
* a client that resumes reading within the close timeout receives every
  frame queued before the close, then the 4008 close frame; otherwise the
  transport is aborted (the kernel's buffers are freed with a reset).

Under another ``ws_impl`` (no such protocol object) a stall marks the
connection gone, stops the session's work and leaves closing to uvicorn.

Kernel send buffer.  Linux autotunes a TCP socket's send buffer up to
``net.ipv4.tcp_wmem``'s maximum (4 MiB by default): a client that stops
reading would park about 90 s of 22 kHz 16-bit audio in the kernel before
the transport ever pushed back, and the engine would decode all of it.  The
WebSocket's socket is therefore given a fixed ``SO_SNDBUF`` of
``SEND_BUFFER_BYTES`` (the kernel doubles it for bookkeeping), ample for
audio bitrates (at most 192 kB/s) over any round-trip time under 300 ms.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from gateway import protocol
from gateway.flow.stall import (
    STALL_CLOSE_CODE,
    STALL_CLOSE_REASON,
    STALL_CLOSE_TIMEOUT_S,
    Stalled,
    StallGuard,
)
from gateway.ops.metrics import Metrics
from gateway.ws.pings import watch_pings

log = logging.getLogger(__name__)

#: scope key under which ``TransportMiddleware`` stores uvicorn's protocol
SCOPE_KEY = "gateway.ws_protocol"
#: fixed kernel send buffer of a WebSocket connection (see above)
SEND_BUFFER_BYTES = 65536


class ConnectionGone(Exception):
    """The client went away; the session's work must stop."""


class TransportMiddleware:
    """Pure ASGI middleware: remembers uvicorn's WebSocket protocol object
    (``send.__self__``) in the scope so that ``Outbound`` can abort a stalled
    transport, and watches its ping frames for the idle timeout
    (``gateway.ws.pings``).  Does nothing for other scopes or servers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            owner = getattr(send, "__self__", None)
            if owner is not None and hasattr(owner, "transport") and hasattr(owner, "conn"):
                scope[SCOPE_KEY] = owner
                watch_pings(owner, scope)
        await self.app(scope, receive, send)


def cap_send_buffer(transport: Any) -> None:
    """Fix the socket's kernel send buffer at ``SEND_BUFFER_BYTES`` (also HTTP)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    except OSError as exc:  # not a TCP socket (tests, unix sockets)
        log.debug("SO_SNDBUF not set: %r", exc)


def _abort_if_unsent(transport: Any) -> None:
    """Abort the transport unless it is closing with nothing left to send:
    then it is closed already (the client read the close frame), and
    asyncio's ``abort`` on it raises ``AttributeError`` (its loop is gone)."""
    if not transport.is_closing() or transport.get_write_buffer_size() > 0:
        transport.abort()


class Outbound:
    def __init__(
        self, websocket: WebSocket, metrics: Metrics, stall_timeout_s: float | None = None
    ) -> None:
        self._ws = websocket
        self._metrics = metrics
        self._lock = asyncio.Lock()
        self._stall = StallGuard(stall_timeout_s)
        self._protocol: Any = websocket.scope.get(SCOPE_KEY)
        if self._protocol is not None:
            cap_send_buffer(self._protocol.transport)
        self.gone = False
        #: the connection was closed by the stall timeout (4008)
        self.stalled = False

    async def event(self, message: protocol._Message, text: str | None = None) -> None:
        """Send ``message``; ``text``: its encoding, when the caller already
        made it (the resumable sender logs the same text it sends)."""
        if isinstance(message, protocol.Error):
            self._metrics.errors.labels(code=str(message.code)).inc()
        await self._send(protocol.encode_text(message) if text is None else text, None)

    async def audio(self, payload: bytes) -> None:
        await self._send(None, payload)
        self._metrics.frames_sent.inc()
        self._metrics.bytes_sent.inc(len(payload))

    async def encoded(self, text: str | None, data: bytes | None) -> None:
        """A message already encoded (sent again by a resume): no metrics."""
        await self._send(text, data)

    def abort(self) -> None:
        """Drop the connection now, sending nothing more (a resume took its
        session): the transport is aborted where uvicorn's is reachable."""
        self.gone = True
        if self._protocol is not None:
            self._protocol.transport.abort()

    async def _send(self, text: str | None, data: bytes | None) -> None:
        if self.gone:
            raise ConnectionGone
        async with self._lock:
            if self.gone:
                raise ConnectionGone
            try:
                async with self._stall.send():
                    if text is not None:
                        await self._ws.send_text(text)
                    else:
                        assert data is not None
                        await self._ws.send_bytes(data)
            except Stalled:
                self._close_stalled()
                raise ConnectionGone from None
            except Exception as exc:  # any transport failure ends the session's work
                self.gone = True
                log.debug("send failed: %r", exc)
                raise ConnectionGone from exc

    def _close_stalled(self) -> None:
        """A send stalled (``gateway.flow.stall``): write the 4008 close
        frame past the full buffer now and abort the transport after the
        close timeout."""
        self.gone = True
        self.stalled = True
        log.info("send stalled for %.3g s: closing with 4008", self._stall.timeout_s)
        owner = self._protocol
        if owner is None:
            return
        transport = owner.transport
        try:
            if not transport.is_closing() and not owner.close_sent:
                owner.conn.fail(int(STALL_CLOSE_CODE), STALL_CLOSE_REASON)
                transport.write(b"".join(owner.conn.data_to_send()))
                owner.close_sent = True
                transport.close()  # flushes what it can, then closes
        except Exception as exc:  # the transport is already half gone: abort below
            log.debug("stall close failed: %r", exc)
        asyncio.get_running_loop().call_later(STALL_CLOSE_TIMEOUT_S, _abort_if_unsent, transport)

    async def close(self, code: int, reason: str = "") -> None:
        if self.gone:
            return
        async with self._lock:
            if self.gone:
                return
            self.gone = True
            try:
                # a close frame waits for the write buffer like any send
                async with self._stall.send():
                    await self._ws.close(code, reason[:120])
            except Stalled:
                self._close_stalled()
            except Exception as exc:  # already closed by the peer
                log.debug("close failed: %r", exc)
