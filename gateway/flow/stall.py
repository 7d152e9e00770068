"""The stall close policy.

A send that waits ``stall_timeout_s`` for the transport to accept it means
the client stopped reading: the connection is closed with 4008
(``CloseCode.STALL_TIMEOUT``), and the transport is aborted if the client
has not read the close frame ``STALL_CLOSE_TIMEOUT_S`` later.  Writing the
close frame past a full buffer is transport-specific and lives in
``gateway.ws.outbound``; this module decides *when*.

A guarded send is only ever blocked before the first byte of its frame is
written (see ``gateway.ws.outbound``), so abandoning it cuts nothing half-way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.errors import CloseCode

#: after a stall, how long the 4008 close frame may wait for the client to
#: read it before the transport is aborted
STALL_CLOSE_TIMEOUT_S = 2.0
#: the close code of a stalled connection
STALL_CLOSE_CODE = CloseCode.STALL_TIMEOUT
STALL_CLOSE_REASON = "stall timeout"


class Stalled(Exception):
    """A send waited the whole stall timeout for the client to read."""


class StallGuard:
    """Bounds how long one send may wait for the transport (None: forever)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s

    @asynccontextmanager
    async def send(self) -> AsyncIterator[None]:
        """Wrap one transport write; raises ``Stalled`` past the timeout."""
        try:
            async with asyncio.timeout(self.timeout_s):
                yield
        except TimeoutError:
            raise Stalled from None
