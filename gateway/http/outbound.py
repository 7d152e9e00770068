"""HTTP response bodies under the stall rule (``gateway.flow.stall``).

A client that posts a long streamed speech request and stops reading must
not hold its ``max_http_streams`` slot, its engine work and its buffers
forever.  ``GuardedSend`` wraps the ASGI ``send`` of a speech response:

* it caps the connection's kernel send buffer at ``SEND_BUFFER_BYTES``, as
  the WebSocket path does (``gateway.ws.outbound``): otherwise Linux autotunes
  it to about 4 MiB on loopback and a blocked send shows only after a minute
  of audio;
* a send that waits ``stall_timeout_s`` for the client to read raises
  ``HttpStalled`` and aborts the transport.  uvicorn's HTTP ``send`` (h11
  and httptools alike) first awaits ``flow.drain()`` while the transport is
  paused and only then writes the whole message synchronously, so an
  abandoned send has written none of its bytes; the client sees a body cut
  short (never a clean end), uvicorn reports ``http.disconnect``, and the
  response's producer is cancelled, which cancels the engine stream and
  releases the admission slot (``gateway.http.speech``).

A response that fails after its status went out is ``cut``: the transport is
closed after what was sent, so the client sees an incomplete body, and the
application returns normally (no traceback for a failure already reported
in one log line).

Reaching the transport: Starlette's ``ServerErrorMiddleware`` (always the
outermost layer) wraps ``send`` for HTTP scopes, so ``TransportMiddleware``
cannot see uvicorn's request cycle there.  ``GatewayApp`` (``gateway.app``)
records it with ``remember_http_cycle`` before its middleware runs: at that
point ``send`` is the bound method ``RequestResponseCycle.send``, whose
``__self__`` owns ``transport``.  Under another server (no such object) the
stall still ends the response and its work; closing is left to the server.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.types import Message, Scope, Send

from gateway.flow.stall import Stalled, StallGuard
from gateway.ws.outbound import cap_send_buffer

log = logging.getLogger(__name__)

#: scope key under which ``remember_http_cycle`` stores uvicorn's request cycle
HTTP_SCOPE_KEY = "gateway.http_cycle"


class HttpStalled(Exception):
    """A response body send waited the whole stall timeout: the client
    stopped reading and its connection was aborted."""


def remember_http_cycle(scope: Scope, send: Send) -> None:
    """Store uvicorn's request cycle (``send.__self__``) in an HTTP scope."""
    if scope["type"] != "http":
        return
    owner = getattr(send, "__self__", None)
    if owner is not None and hasattr(owner, "transport") and hasattr(owner, "flow"):
        scope[HTTP_SCOPE_KEY] = owner


class GuardedSend:
    """``send`` for one HTTP response, with the stall rule and a capped
    kernel send buffer."""

    def __init__(self, scope: Scope, send: Send, timeout_s: float | None) -> None:
        self._send = send
        self._stall = StallGuard(timeout_s)
        self._cycle: Any = scope.get(HTTP_SCOPE_KEY)
        if self._cycle is not None:
            cap_send_buffer(self._cycle.transport)

    async def __call__(self, message: Message) -> None:
        try:
            async with self._stall.send():
                await self._send(message)
        except Stalled:
            log.info("HTTP response stalled for %.3g s: connection aborted", self._stall.timeout_s)
            if self._cycle is not None:
                transport = self._cycle.transport
                if not transport.is_closing() or transport.get_write_buffer_size() > 0:
                    transport.abort()
            raise HttpStalled from None

    def cut(self) -> bool:
        """End the response short of its end: what was sent is flushed, then
        the connection is closed, so the client sees an incomplete body (the
        caller waits for uvicorn's ``http.disconnect`` before returning, or
        uvicorn would log an application that "returned without completing
        response").  False under a server whose transport is not reachable
        (the caller raises instead, and the server closes the connection)."""
        if self._cycle is None:
            return False
        self._cycle.transport.close()
        return True


#: longest wait for a cut response's connection to be gone
CUT_WAIT_S = 2.0
