"""The session's one way out: serialized sends to the WebSocket.

Every JSON event and binary frame goes through ``Outbound`` so that sends
never interleave mid-message and a failed send stops the session's work
(a dead socket must not keep the engine busy).  Sends are never cancelled
half-way: producers stop instead.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.websockets import WebSocket

from gateway import protocol
from gateway.metrics import Metrics

log = logging.getLogger(__name__)


class ConnectionGone(Exception):
    """The client went away; the session's work must stop."""


class Outbound:
    def __init__(self, websocket: WebSocket, metrics: Metrics) -> None:
        self._ws = websocket
        self._metrics = metrics
        self._lock = asyncio.Lock()
        self.gone = False

    async def event(self, message: protocol._Message) -> None:
        if isinstance(message, protocol.Error):
            self._metrics.errors.labels(code=str(message.code)).inc()
        await self._send(protocol.encode_text(message), None)

    async def audio(self, payload: bytes) -> None:
        await self._send(None, payload)
        self._metrics.frames_sent.inc()
        self._metrics.bytes_sent.inc(len(payload))

    async def _send(self, text: str | None, data: bytes | None) -> None:
        if self.gone:
            raise ConnectionGone
        async with self._lock:
            if self.gone:
                raise ConnectionGone
            try:
                if text is not None:
                    await self._ws.send_text(text)
                else:
                    assert data is not None
                    await self._ws.send_bytes(data)
            except Exception as exc:  # any transport failure ends the session's work
                self.gone = True
                log.debug("send failed: %r", exc)
                raise ConnectionGone from exc

    async def close(self, code: int, reason: str = "") -> None:
        if self.gone:
            return
        async with self._lock:
            if self.gone:
                return
            self.gone = True
            try:
                await self._ws.close(code, reason[:120])
            except Exception as exc:  # already closed by the peer
                log.debug("close failed: %r", exc)
