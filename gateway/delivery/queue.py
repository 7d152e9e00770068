"""The segment queue shared by WebSocket and HTTP speech.

Both paths speak text as a sequence of segments (``gateway.text.segmenter``),
each one engine job, in order: the segment being spoken is ``current``, the
ones after it wait in ``waiting``, and the head of ``waiting`` is submitted
early (prefetch) so the engine's first stage overlaps the current segment's
decode and consecutive segments join without a gap.  ``SegmentQueue`` is
that bookkeeping; submitting a segment (the engine call) is the caller's
``submit``, and ``room`` says whether a prefetch may add decoded audio now
(the WebSocket session's buffer; HTTP always has room).

Users: ``gateway.session.audio_stream.AudioStream`` (a session's live queue, fed as text
arrives) and ``gateway.http.synthesis.synthesize`` (a whole request's text);
both speak each segment through ``gateway.delivery.segment.SegmentAudio``.
No I/O, no tasks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from gateway.engines.base import SynthesisJob


class HasJob(Protocol):
    job: SynthesisJob | None


S = TypeVar("S", bound=HasJob)


def _always() -> bool:
    return True


class SegmentQueue(Generic[S]):
    def __init__(self, submit: Callable[[S], None], room: Callable[[], bool] = _always) -> None:
        self._submit = submit
        self._room = room
        self.waiting: deque[S] = deque()
        self.current: S | None = None

    def __iter__(self) -> Iterator[S]:
        """Every segment not yet finished: the current one, then the waiting."""
        if self.current is not None:
            yield self.current
        yield from self.waiting

    def __bool__(self) -> bool:
        return self.current is not None or bool(self.waiting)

    def append(self, segment: S) -> None:
        self.waiting.append(segment)
        self.prefetch()

    def prefetch(self) -> None:
        """Submit the head of the waiting segments early, if there is room."""
        if self.waiting and self.waiting[0].job is None and self._room():
            self._submit(self.waiting[0])

    def start_next(self) -> S:
        """The next segment becomes current (submitted now if it was not)."""
        segment = self.waiting.popleft()
        if segment.job is None:
            self._submit(segment)
        self.current = segment
        self.prefetch()
        return segment

    def finish(self) -> None:
        """The current segment is done; the next may be submitted now."""
        self.current = None
        self.prefetch()

    def drop(self, which: Callable[[S], bool]) -> None:
        """Remove the waiting segments ``which`` selects and cancel their jobs."""
        dropped = [s for s in self.waiting if which(s)]
        if dropped:
            self.waiting = deque(s for s in self.waiting if not which(s))
            for segment in dropped:
                if segment.job is not None:
                    segment.job.cancel()

    def cancel_jobs(self) -> None:
        """Cancel every submitted job (current and waiting); nothing is removed."""
        for segment in self:
            if segment.job is not None:
                segment.job.cancel()

    def clear(self) -> None:
        """Cancel every job and forget the waiting segments."""
        self.cancel_jobs()
        self.waiting.clear()
