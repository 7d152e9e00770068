"""One context's listener: how much audio is ahead of it.

The one model of the listener, updated once per frame sent (``on_sent``,
counted by ``admit``) and once per ``playback`` report (``on_played``).  It
answers three questions:

* **admission** (``admit``, ``fits``, ``lead_ms``): how far ahead of the
  listener one context may send, by ``session.config.flow_control``:

  - ``none``: no application bound; the transport's backpressure still holds;
  - ``ack``: the client reports ``playback.played_ms``; the server never has
    more than ``max_lead_ms`` sent beyond the last report;
  - ``realtime``: no reports needed; the listener's position is estimated
    with a leaky bucket, ``played = min(sent, played_then + elapsed)``,
    which restarts whenever everything sent has been played (so gaps and
    underruns do not make the estimate drift ahead of the listener).

* **cancel positions** (``position``): the same consumed position, with the
  source it came from (``played_ms``, ``estimate`` or ``sent_ms``).

* **segmentation** (``ahead_s``): the best guess of the audio sent and not
  yet heard, under every mode, for the segmentation policy
  (``gateway.text.policy``).  Two sources, best first:

  - ``playback`` reports: the client said it had played ``played_ms`` at the
    time the report arrived; since then it is assumed to play on in real
    time, so ``ahead = sent - played - elapsed`` (never below zero);
  - the send clock, when the client sends no reports: a player that starts
    at the first frame and, after running dry, resumes the moment the next
    frame arrives (the harness's player, ``gateway.bench.measure.playout``).
    Its buffer runs out at ``cursor``: each frame moves it to
    ``max(cursor, now) + frame``.  It restarts at every new utterance
    (``new_utterance``).  This is the lower bound a client with no
    prebuffer sees; a client that buffers more is ahead of it, which only
    makes the policy cut earlier than needed.

Admission must never let the server run further ahead than the client
allows, so under ``ack`` it counts only what was reported; segmentation
must never leave the listener dry, so it extrapolates reports and assumes a
fresh player at each utterance.  Hence two views of one state.

A silent ``ack`` listener: a client under ``ack`` that reads audio but never
reports ``playback`` would hold its window closed (and its stream slot)
forever.  When a frame has waited on a closed window for ``ack_timeout_s``
with no ``playback`` report meanwhile (``silent``), ``admit`` raises
``ListenerSilent``; the session core cancels the utterance, reports it and
tells the client (``error`` ``listener_silent``).

All positions are milliseconds since the context started (the
``playback.played_ms`` origin); times are seconds on any monotonic clock.
The arithmetic is pure; ``admit`` is the thin async wait on top.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from gateway.protocol import FlowControl, PositionSource

_SOURCES: dict[FlowControl, PositionSource] = {
    "none": "sent_ms",
    "ack": "played_ms",
    "realtime": "estimate",
}


class ListenerSilent(Exception):
    """An ``ack`` listener sent no ``playback`` for ``ack_timeout_s`` while a
    frame waited on its closed window."""


class Listener:
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
        self._played_ms: float | None = None  #: the last report (None: none yet)
        self._reported_at = 0.0
        #: when the last report arrived, advancing or not (None: none yet)
        self._last_report_at: float | None = None
        # the realtime leaky bucket: played position and time at its last restart
        self._anchor_played = 0.0
        self._anchor_time: float | None = None
        #: the send clock of the current utterance: when its buffer runs out
        self._cursor: float | None = None
        self._changed = asyncio.Event()

    # -- updates -----------------------------------------------------------
    def configure(
        self, mode: FlowControl, max_lead_ms: float, ack_timeout_s: float | None = None
    ) -> None:
        self.mode = mode
        self.max_lead_ms = float(max_lead_ms)
        self.ack_timeout_s = ack_timeout_s
        self._changed.set()

    def new_utterance(self) -> None:
        """A new utterance begins: the send clock starts again at its first
        frame.  Without reports the server cannot know whether the previous
        utterance's audio is still playing (its ``session.done`` follows the
        last frame *sent*, long before it is heard when audio is sent faster
        than real time), so it assumes the least: a player that starts each
        utterance afresh, as the harness's does.  That errs toward cutting a
        segment early, never toward a gap.  Reports, when the client sends
        them, still hold across utterances, and so does admission."""
        self._cursor = None

    def on_sent(self, frame_ms: float, now: float) -> None:
        """A frame of ``frame_ms`` left for the client at ``now``."""
        if self.mode == "realtime" and (
            self._anchor_time is None or self.estimate(now) >= self.sent_ms
        ):
            # the listener had caught up: playback (re)starts with this frame
            self._anchor_played = self.sent_ms
            self._anchor_time = now
        start = now if self._cursor is None else max(self._cursor, now)
        self._cursor = start + frame_ms / 1000.0
        self.sent_ms += frame_ms

    def on_played(self, played_ms: float, now: float) -> None:
        """A ``playback`` report at ``now``; positions only move forward."""
        self._last_report_at = now
        if self._played_ms is None or played_ms > self._played_ms:
            self._played_ms = played_ms
            self._reported_at = now
            self._changed.set()

    def interrupt(self) -> None:
        """Wake a waiting ``admit`` (cancel, close) so it re-checks ``stop``."""
        self._changed.set()

    # -- what the client reported ------------------------------------------
    @property
    def played_ms(self) -> float:
        """The last ``played_ms`` the client reported (0 before any)."""
        return self._played_ms or 0.0

    @property
    def reported(self) -> bool:
        return self._played_ms is not None

    # -- admission and cancel positions -------------------------------------
    def estimate(self, now: float) -> float:
        """The consumed position admission and cancel reports go by."""
        if self.mode == "ack":
            return min(self.played_ms, self.sent_ms)
        if self.mode == "realtime":
            if self._anchor_time is None:
                return self.sent_ms
            elapsed_ms = (now - self._anchor_time) * 1000
            return min(self.sent_ms, self._anchor_played + elapsed_ms)
        return self.sent_ms

    def position(self, now: float) -> tuple[float, PositionSource]:
        return self.estimate(now), _SOURCES[self.mode]

    def lead_ms(self, now: float) -> float:
        """Audio sent and not yet consumed, as admission counts it."""
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
        report for ``ack_timeout_s``."""
        if self.mode != "ack" or self.ack_timeout_s is None:
            return False
        return now - self._quiet_since(waiting_since) >= self.ack_timeout_s

    def _quiet_since(self, waiting_since: float) -> float:
        return max(waiting_since, self._last_report_at or waiting_since)

    # -- segmentation ---------------------------------------------------------
    def ahead_s(self, now: float) -> float:
        """Seconds of sent audio the listener has not played yet (best guess)."""
        if self._played_ms is not None:
            unplayed_ms = max(0.0, self.sent_ms - self._played_ms)
            elapsed_ms = max(0.0, now - self._reported_at) * 1000.0
            return max(0.0, unplayed_ms - elapsed_ms) / 1000.0
        if self._cursor is None:
            return 0.0
        return max(0.0, self._cursor - now)

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
                quiet_since = self._quiet_since(waiting_since)
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
