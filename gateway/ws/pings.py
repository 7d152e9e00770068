"""Protocol-level WebSocket pings, seen as activity for the idle timeout.

Voice-agent frameworks keep their TTS socket open between turns with the
WebSocket library's own keepalive (RFC 6455 ping frames: ``websockets``
sends one every 20 s by default, aiohttp's ``heartbeat`` likewise).  uvicorn
answers those pings itself and never tells the application, so without this
module an agent quiet between turns would be closed with 4002 although its
connection is demonstrably alive.

``watch_pings`` wraps the ``handle_ping`` method of uvicorn's
``websockets-sansio`` protocol object (the one ``TransportMiddleware``
already reaches, see ``gateway.ws.outbound``) on that one instance: every ping
frame received stamps a ``PingWatch`` before uvicorn answers it.  Under the
other ``ws_impl`` values there is no such hook and only client messages
(including the protocol's JSON ``ping``) count; docs/protocol.md says so.

It must not do anything else: answering the ping stays uvicorn's job.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from typing import Any

#: scope key under which the ``PingWatch`` of a WebSocket connection lives
SCOPE_KEY = "gateway.ping_watch"


class PingWatch:
    """When the last ping frame of one connection arrived (monotonic s)."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.count = 0

    def seen(self) -> None:
        self.last = time.monotonic()
        self.count += 1


def watch_pings(owner: Any, scope: MutableMapping[str, Any]) -> None:
    """Stamp a ``PingWatch`` (stored in ``scope``) on every ping ``owner``
    receives.  Does nothing when ``owner`` has no ``handle_ping`` hook."""
    original: Callable[[], None] | None = getattr(owner, "handle_ping", None)
    if original is None or not callable(original):
        return
    watch = PingWatch()

    def handle_ping() -> None:
        watch.seen()
        original()

    owner.handle_ping = handle_ping
    scope[SCOPE_KEY] = watch
