"""The listener window: how far ahead of the listener one context may send
(application-level flow control).

Modes (``session.config.flow_control``):

* ``none``: no application bound; the transport's backpressure still holds.
* ``ack``: the client reports ``playback.played_ms``; the server never has
  more than ``max_lead_ms`` sent beyond the last report.
* ``realtime``: no reports needed; the listener's position is estimated
  with a leaky bucket, ``played = min(sent, played_then + elapsed)``, which
  restarts whenever everything sent has been played (so gaps and underruns do
  not make the estimate drift ahead of the listener).

All positions are milliseconds since the context started.  The arithmetic
is pure (``lead_ms``, ``estimate``, ``silent``); ``admit`` is the thin async
wait on top.

A silent ``ack`` listener: a client under ``ack`` that reads audio but never
reports ``playback`` would hold its window closed (and its stream slot)
forever.  When a frame has waited on a closed window for ``ack_timeout_s``
with no ``playback`` report meanwhile (``silent``), ``admit`` raises
``ListenerSilent``; the session cancels the utterance, reports it and tells
the client (``error`` ``listener_silent``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from gateway.protocol import FlowControl, PositionSource


class ListenerSilent(Exception):
    """An ``ack`` listener sent no ``playback`` for ``ack_timeout_s`` while a
    frame waited on its closed window."""


class ListenerWindow:
    def __init__(
        self,
        mode: FlowControl = "none",
        max_lead_ms: float = 1000.0,
        ack_timeout_s: float | None = None,
    ) -> None:
        self.mode: FlowControl = mode
        self.max_lead_ms = float(max_lead_ms)
        #: ``ack`` only: a frame waiting this long with no report raises ``ListenerSilent``
        self.ack_timeout_s = ack_timeout_s
        self.sent_ms = 0.0
        self.played_ms = 0.0  #: the last ``played_ms`` the client reported
        self.reported_at: float | None = None  #: when the last ``playback`` arrived
        self._anchor_played = 0.0
        self._anchor_time: float | None = None
        self._changed = asyncio.Event()

    def configure(
        self, mode: FlowControl, max_lead_ms: float, ack_timeout_s: float | None = None
    ) -> None:
        self.mode = mode
        self.max_lead_ms = float(max_lead_ms)
        self.ack_timeout_s = ack_timeout_s
        self._changed.set()

    # -- pure arithmetic ---------------------------------------------------
    def estimate(self, now: float) -> float:
        """The best-known consumed position."""
        if self.mode == "ack":
            return min(self.played_ms, self.sent_ms)
        if self.mode == "realtime":
            if self._anchor_time is None:
                return self.sent_ms
            elapsed_ms = (now - self._anchor_time) * 1000
            return min(self.sent_ms, self._anchor_played + elapsed_ms)
        return self.sent_ms

    def position(self, now: float) -> tuple[float, PositionSource]:
        source: PositionSource = {"ack": "played_ms", "realtime": "estimate"}.get(
            self.mode, "sent_ms"
        )  # type: ignore[assignment]
        return self.estimate(now), source

    def lead_ms(self, now: float) -> float:
        """Audio sent and not yet consumed."""
        return self.sent_ms - self.estimate(now)

    def fits(self, frame_ms: float, now: float) -> bool:
        if self.mode == "none":
            return True
        lead = self.lead_ms(now)
        # one frame may always go when nothing is outstanding, so a frame
        # longer than the window cannot deadlock the stream
        return lead <= 0 or lead + frame_ms <= self.max_lead_ms

    def silent(self, waiting_since: float, now: float) -> bool:
        """Under ``ack``: a frame waiting since ``waiting_since`` has seen no
        report for ``ack_timeout_s`` (the window is closed)."""
        if self.mode != "ack" or self.ack_timeout_s is None:
            return False
        quiet_since = max(waiting_since, self.reported_at or waiting_since)
        return now - quiet_since >= self.ack_timeout_s

    def on_sent(self, frame_ms: float, now: float) -> None:
        if self.mode == "realtime" and (
            self._anchor_time is None or self.estimate(now) >= self.sent_ms
        ):
            # the listener had caught up: playback (re)starts with this frame
            self._anchor_played = self.sent_ms
            self._anchor_time = now
        self.sent_ms += frame_ms

    def on_played(self, played_ms: float, now: float | None = None) -> None:
        """A client report; positions only move forward."""
        self.reported_at = time.monotonic() if now is None else now
        if played_ms > self.played_ms:
            self.played_ms = played_ms
            self._changed.set()

    def interrupt(self) -> None:
        """Wake a waiting ``admit`` (cancel, close) so it re-checks ``stop``."""
        self._changed.set()

    # -- async wait --------------------------------------------------------
    async def admit(self, frame_ms: float, stop: Callable[[], bool]) -> bool:
        """Wait until a frame of ``frame_ms`` fits, then count it as sent.

        Returns False, sending nothing, if ``stop()`` turns true meanwhile;
        raises ``ListenerSilent`` (``silent``) under ``ack``."""
        waiting_since = time.monotonic()
        while not self.fits(frame_ms, time.monotonic()):
            if stop():
                return False
            now = time.monotonic()
            if self.silent(waiting_since, now):
                raise ListenerSilent
            self._changed.clear()
            timeout = None
            if self.mode == "realtime":
                excess = self.lead_ms(now) + frame_ms - self.max_lead_ms
                timeout = max(0.001, excess / 1000)
            elif self.mode == "ack" and self.ack_timeout_s is not None:
                quiet_since = max(waiting_since, self.reported_at or waiting_since)
                timeout = max(0.001, quiet_since + self.ack_timeout_s - now)
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
            # task cancel that lands as the event is set (interrupt() then
            # stop() on disconnect), leaving the stream task alive
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()
        if stop():
            return False
        self.on_sent(frame_ms, time.monotonic())
        return True
