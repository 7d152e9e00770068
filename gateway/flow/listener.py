"""How much audio lies ahead of one context's listener: a pure estimate.

Two sources, best first:

* ``playback`` reports: the client said it had played ``played_ms`` at the
  time the report arrived; since then it is assumed to play on in real time,
  so ``ahead = sent - played - elapsed`` (never below zero, never above what
  was sent and unplayed at the report);
* the send clock, when the client sends no reports: a player that starts
  at the first frame and, after running dry, resumes the moment the next
  frame arrives (the harness's player, ``gateway.bench.measure.playout``).
  Its buffer runs out at ``cursor``: each frame moves it to
  ``max(cursor, now) + frame``.  This is audio sent minus time elapsed since
  the utterance's first frame, restarted after every gap and at every new
  utterance (``new_utterance``).

The send clock is the lower bound a client with no prebuffer sees; a client
that buffers more before it starts is ahead of it, which only makes the
policy cut earlier than needed.  All positions are per context, in
milliseconds since the context started (the ``playback.played_ms`` origin);
times are seconds on any monotonic clock.
"""

from __future__ import annotations


class ListenerBuffer:
    def __init__(self) -> None:
        self.sent_ms = 0.0
        self._cursor: float | None = None  #: send clock: when the buffer runs out
        self._played_ms: float | None = None  #: the last report
        self._reported_at = 0.0

    def on_sent(self, frame_ms: float, now: float) -> None:
        """A frame of ``frame_ms`` left for the client at ``now``."""
        start = now if self._cursor is None else max(self._cursor, now)
        self._cursor = start + frame_ms / 1000.0
        self.sent_ms += frame_ms

    def new_utterance(self) -> None:
        """A new utterance begins: the send clock starts again at its first
        frame.  Without reports the server cannot know whether the previous
        utterance's audio is still playing (its ``session.done`` follows the
        last frame *sent*, long before it is heard when audio is sent faster
        than real time), so it assumes the least: a player that starts each
        utterance afresh, as the harness's does.  That errs toward cutting a
        segment early, never toward a gap.  Reports, when the client sends
        them, still hold across utterances."""
        self._cursor = None

    def on_played(self, played_ms: float, now: float) -> None:
        """A ``playback`` report; positions only move forward."""
        if self._played_ms is None or played_ms > self._played_ms:
            self._played_ms = played_ms
            self._reported_at = now

    @property
    def reported(self) -> bool:
        return self._played_ms is not None

    def ahead_s(self, now: float) -> float:
        """Seconds of sent audio the listener has not played yet."""
        if self._played_ms is not None:
            unplayed_ms = max(0.0, self.sent_ms - self._played_ms)
            elapsed_ms = max(0.0, now - self._reported_at) * 1000.0
            return max(0.0, unplayed_ms - elapsed_ms) / 1000.0
        if self._cursor is None:
            return 0.0
        return max(0.0, self._cursor - now)
