"""Silence made by the gateway: the job of a segment with nothing to speak,
and SSML ``<break>`` pauses.

``SilentJob`` stands for a segment with nothing for the engine to read (an
emoji alone, a skipped code block, ``---``): it is reported as a sentence
with no audio, and the engine is not called.  ``pause_ms`` says where a
segment's pauses fall; ``pause_samples`` is the silence itself.  Pure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np

from gateway.engines.base import EngineEvent, SegmentStats, SynthesisJob
from gateway.text.frontend import SpokenSegment


class SilentJob(SynthesisJob):
    """The job of a segment with nothing for the engine to read: no events;
    the caller adds its pauses as silence."""

    def __init__(self) -> None:
        self.stats = SegmentStats(audio_seconds=0.0)

    async def _events(self) -> AsyncIterator[EngineEvent]:
        return
        yield  # an async generator with no items

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._events()

    def cancel(self) -> None:
        self.stats.cancelled = True


def pause_ms(spoken: SpokenSegment | None) -> tuple[int, int]:
    """The segment's ``<break>`` pauses as (ms before its speech, ms after).

    A pause at the start of the spoken text (or in a segment with no text)
    comes before it; a pause anywhere else is heard after the segment's
    speech, where the engine's audio ends.  The segmenter ends a segment
    after each ``<break>``, so that is where it stands; only an uncut
    (``none``) segment can hold one mid-text (``docs/text.md``)."""
    if spoken is None:
        return 0, 0
    before = sum(ms for at, ms in spoken.pauses if at <= 0 or not spoken.text)
    after = sum(ms for at, ms in spoken.pauses if at > 0 and spoken.text)
    return before, after


def pause_samples(ms: int, rate: int) -> np.ndarray:
    """Silence of ``ms`` milliseconds at ``rate`` (float32 mono)."""
    return np.zeros(max(0, round(ms * rate / 1000)), np.float32)
