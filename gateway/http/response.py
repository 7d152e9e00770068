"""``SpeechResponse``: an ASGI response that produces its body while
listening for the client going away.

On an ``http.disconnect`` the producer is cancelled, and with it the engine
jobs (the body generator's ``finally``).  A client that stops reading is
treated the same way after ``stall_timeout_s`` (``gateway.http.outbound``:
the connection is aborted, the body ends cut short).  Headers go out with
the first body piece, so a failure before any audio is still a proper JSON
error; after it, the body is cut short so the client sees an incomplete
response, never a clean end.  A bug in the gateway is ``internal`` with a
log line and no exception text.

What it must not do: keep producing for a client that left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable

from starlette.types import Message, Receive, Scope, Send

from gateway.errors import GatewayError
from gateway.http.errors import error_response, internal_error
from gateway.http.outbound import CUT_WAIT_S, GuardedSend, HttpStalled
from gateway.state import GatewayState

log = logging.getLogger(__name__)


class SpeechResponse:
    """The body is produced while listening for a disconnect; ``whole``
    collects it first and sends it with a Content-Length.  ``on_close``
    runs once the response is over, however it ended (the admission slot)."""

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        *,
        media_type: str,
        headers: dict[str, str],
        state: GatewayState,
        whole: bool = False,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.body = body
        self.media_type = media_type
        self.headers = headers
        self.state = state
        self.whole = whole
        self.on_close = on_close
        self.started = False  #: the status line went out
        self.cut = False  #: failed mid-body: the connection was closed

    def _start(self, length: int | None) -> Message:
        headers = [(b"content-type", self.media_type.encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        return {"type": "http.response.start", "status": 200, "headers": headers}

    async def _produce(self, send: Send) -> None:
        try:
            await self._produce_guarded(send)
        except HttpStalled:
            # the client stopped reading: its connection is aborted
            # (gateway.http.outbound); the finally below stops the engine work
            pass
        finally:
            await self.body.aclose()

    async def _send_body(self, send: Send) -> None:
        if self.whole:
            data = b"".join([piece async for piece in self.body])
            await send(self._start(len(data)))
            self.started = True
            await send({"type": "http.response.body", "body": data, "more_body": False})
            self.state.metrics.bytes_sent.inc(len(data))
            return
        async for piece in self.body:
            if not self.started:
                await send(self._start(None))
                self.started = True
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            self.state.metrics.bytes_sent.inc(len(piece))
        if not self.started:
            await send(self._start(None))
            self.started = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _produce_guarded(self, send: Send) -> None:
        self.started = False
        try:
            await self._send_body(send)
        except HttpStalled:
            raise
        except Exception as exc:
            error = exc if isinstance(exc, GatewayError) else internal_error("speech response")
            if self.started:
                # the status is gone already: cut the body short so the
                # client sees an incomplete response, never a clean end
                log.warning("HTTP speech failed mid-response: %s", error.message)
                self.state.metrics.errors.labels(code=str(error.code)).inc()
                if isinstance(send, GuardedSend) and send.cut():
                    self.cut = True  # closed after what was sent: no traceback
                    return
                raise error from None
            response = error_response(error, self.state)
            await response({"type": "http"}, _never_receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def listen() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return

        guarded = GuardedSend(scope, send, self.state.settings.stall_timeout_s)
        producer = asyncio.create_task(self._produce(guarded))
        listener = asyncio.create_task(listen())
        try:
            await asyncio.wait({producer, listener}, return_when=asyncio.FIRST_COMPLETED)
            if not producer.done():
                log.info("HTTP client went away: speech work stopped")
                producer.cancel()
            elif self.cut:
                # the connection is closing: return once uvicorn saw it go
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CUT_WAIT_S):
                        await asyncio.shield(listener)
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            with contextlib.suppress(asyncio.CancelledError):
                await producer
        finally:
            if not producer.done():
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)
            if self.on_close is not None:
                self.on_close()


async def _never_receive() -> Message:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}
