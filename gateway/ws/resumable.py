"""A session's way out that survives its connection: ``ResumableSender``.

It is the session's ``Sender`` (``gateway.session.audio_stream.Sender``):
every message goes to the current connection's ``Outbound`` and into the
session's ``ReplayLog`` (``gateway.session.replay``), in the order written.
When a send fails and the session may be resumed (``resumable``), the
sender is *suspended* instead of gone: the failed message stays in the log
(the client may not have got it), and every later send waits until a
resume attaches a new connection (``attach``) or the session ends
(``end``).  The waiting sends hold the session's audio, so its engine work
stops once the session buffer (``max_buffered_ms``) is full.

``attach`` sends the resume's answer and then the messages the client did
not get, under the lock that orders every send, so live messages follow
them.  Without ``resumable`` a failed send ends the sender
(``ConnectionGone``), as a plain ``Outbound`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from gateway import protocol
from gateway.session.replay import ReplayLog, Sent
from gateway.ws.outbound import ConnectionGone, Outbound


class ResumableSender:
    def __init__(self, out: Outbound, log: ReplayLog, resumable: Callable[[], bool]) -> None:
        self.out = out
        self.log = log
        self._resumable = resumable
        self._lock = asyncio.Lock()
        self._attached = asyncio.Event()
        self._attached.set()
        self.suspended = False
        #: the session's connection is gone for good
        self.ended = False

    @property
    def gone(self) -> bool:
        return self.ended

    @property
    def stalled(self) -> bool:
        return self.out.stalled

    async def event(self, message: protocol.ServerMessage) -> None:
        text = protocol.encode_text(message)  # once: logged and sent alike
        await self._send(lambda: self.log.event(text), lambda out: out.event(message, text))

    async def audio(self, payload: bytes, counted_as: str | None = None) -> None:
        await self._send(
            lambda: self.log.audio(counted_as, payload), lambda out: out.audio(payload)
        )

    async def unlogged(self, message: protocol.ServerMessage) -> None:
        """A message of this connection only, never sent again (``session.created``)."""
        await self._send(lambda: None, lambda out: out.event(message))

    async def _send(
        self,
        record: Callable[[], None],
        send: Callable[[Outbound], Awaitable[None]],
    ) -> None:
        while True:
            if self.ended:
                raise ConnectionGone
            if self.suspended:
                await self._attached.wait()
                continue
            async with self._lock:
                if self.ended:
                    raise ConnectionGone
                if self.suspended:
                    continue
                record()
                try:
                    await send(self.out)
                except ConnectionGone:
                    if self.out.stalled or not self._resumable():
                        self.ended = True
                        raise
                    self.suspend()
                return

    def suspend(self) -> None:
        """The connection is gone; sends wait for ``attach`` or ``end``."""
        if not self.ended:
            self.suspended = True
            self._attached.clear()

    async def close(self, code: int, reason: str) -> None:
        """Close the connection; the session ends with it."""
        self.end()
        await self.out.close(code, reason)

    def end(self) -> None:
        """The session ends: every waiting send raises ``ConnectionGone``."""
        self.ended = True
        self._attached.set()

    async def attach(
        self, out: Outbound, answer: Sequence[protocol.ServerMessage], replay: Sequence[Sent]
    ) -> None:
        """Resume on ``out``: ``answer`` (not logged), the messages the client
        did not get, then the waiting sends.  ``ConnectionGone`` if ``out``
        fails meanwhile (the session stays suspended)."""
        async with self._lock:
            old, self.out = self.out, out
            old.abort()
            for message in answer:
                await out.event(message)
            for sent in replay:
                await out.encoded(sent.text, sent.data)
            self.suspended = False
            self._attached.set()
