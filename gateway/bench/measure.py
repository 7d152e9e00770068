"""What a listener hears, computed from arrival times: pure, no I/O, no clock.

The harness records, per utterance, when each piece of audio arrived and how
long it plays, and when the client had given the server the text of each
sentence.  ``playout`` replays that on a simulated real-time clock that starts
at the first audio (plus an optional prebuffer) and classifies every gap:

* an **underrun** is a playout gap longer than ``threshold_ms`` (100 ms) while
  the utterance has not ended, counting only the part of the gap after the
  server had the text of the audio that was late;
* **input starvation** is a gap longer than the threshold that is mostly the
  client's doing: the text of the next audio had not been sent yet when the
  listener ran out (a slow LLM is not blamed on the gateway).

Definitions of every measure are in ``docs/benchmarks.md``; the tests in
``tests/test_bench_measure.py`` pin them on synthetic timings.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

UNDERRUN_THRESHOLD_MS = 100.0


@dataclass(frozen=True)
class Piece:
    """A contiguous piece of audio as the client received it."""

    arrival: float  #: seconds (any monotonic origin)
    duration_ms: float
    #: when the server had all the text of this audio (seconds, same origin);
    #: ``-inf`` when it had it from the start
    ready_at: float = -math.inf


@dataclass(frozen=True)
class Gap:
    start: float  #: seconds: when the listener ran out of audio
    end: float  #: seconds: when the next audio arrived
    starved_ms: float  #: part of the gap before the client had sent the text
    underrun: bool
    starvation: bool

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1000.0


@dataclass(frozen=True)
class Playout:
    start: float | None  #: seconds: playback of the first audio began
    end: float | None  #: seconds: the last audio finished playing
    audio_ms: float
    gaps: list[Gap] = field(default_factory=list)

    @property
    def underruns(self) -> int:
        return sum(1 for g in self.gaps if g.underrun)

    @property
    def underrun_ms(self) -> float:
        return sum(g.ms - g.starved_ms for g in self.gaps if g.underrun)

    @property
    def first_underrun_ms(self) -> float | None:
        """Where the first underrun began, in ms of playback from ``start``
        (None: no underrun)."""
        if self.start is None:
            return None
        at = next((g.start for g in self.gaps if g.underrun), None)
        return None if at is None else (at - self.start) * 1000.0

    @property
    def starvations(self) -> int:
        return sum(1 for g in self.gaps if g.starvation)

    @property
    def starvation_ms(self) -> float:
        return sum(g.starved_ms for g in self.gaps if g.starvation)


def playout(
    pieces: Sequence[Piece],
    prebuffer_ms: float = 0.0,
    threshold_ms: float = UNDERRUN_THRESHOLD_MS,
) -> Playout:
    """Play ``pieces`` in order on a real-time clock from the first arrival.

    Playback starts ``prebuffer_ms`` after the first piece arrived and never
    rebuffers: after a gap, it resumes the moment the late piece arrives.
    Gaps of ``threshold_ms`` or less are recorded but are neither underruns
    nor starvation (a jitter buffer of that size hides them).
    """
    if not pieces:
        return Playout(start=None, end=None, audio_ms=0.0)
    start = pieces[0].arrival + prebuffer_ms / 1000.0
    cursor = start
    gaps: list[Gap] = []
    total = 0.0
    for piece in pieces:
        if piece.arrival > cursor:
            gap_s = piece.arrival - cursor
            starved_s = min(max(piece.ready_at - cursor, 0.0), gap_s)
            server_ms = (gap_s - starved_s) * 1000.0
            longer = gap_s * 1000.0 > threshold_ms
            underrun = server_ms > threshold_ms
            gaps.append(
                Gap(
                    start=cursor,
                    end=piece.arrival,
                    starved_ms=starved_s * 1000.0,
                    underrun=underrun,
                    starvation=longer and not underrun and starved_s > 0,
                )
            )
            cursor = piece.arrival
        cursor += piece.duration_ms / 1000.0
        total += piece.duration_ms
    return Playout(start=start, end=cursor, audio_ms=total, gaps=gaps)


# --- when the server had each sentence's text ------------------------------------


def _visible(text: str) -> int:
    return sum(1 for ch in text if not ch.isspace())


def sentence_ready_times(
    sends: Sequence[tuple[float, str]], sentences: Sequence[str], end_at: float
) -> list[float]:
    """For each sentence the server spoke, the time its text could first be cut.

    ``sends`` are the client's ``(time, text)`` increments in order and
    ``sentences`` the ``audio.start.sentence_text`` values in order.  Their
    concatenations agree up to whitespace (docs/protocol.md), so positions are
    counted in non-space characters.  A sentence is ready when the increment
    carrying the next visible character after it was sent (the segmenter
    waits for it to tell ``Dr.`` from ``dr.``), or at ``end_at`` (the flush
    or ``input.done``) if nothing follows.
    """
    cumulative: list[tuple[int, float]] = []  # visible chars sent so far, at time t
    seen = 0
    for t, text in sends:
        seen += _visible(text)
        cumulative.append((seen, t))
    ready: list[float] = []
    boundary = 0
    for sentence in sentences:
        boundary += _visible(sentence)
        at = end_at
        for count, t in cumulative:
            if count > boundary:  # this increment carried the character after it
                at = t
                break
        ready.append(min(at, end_at))
    return ready


# --- statistics ---------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile with linear interpolation (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """``n``, mean, p50, p95, p99 and max of the values that are not None."""
    present = [v for v in values if v is not None]

    def rounded(v: float | None) -> float | None:
        return None if v is None else round(v, 2)

    return {
        "n": len(present),
        "mean": rounded(sum(present) / len(present)) if present else None,
        "p50": rounded(percentile(present, 50)),
        "p95": rounded(percentile(present, 95)),
        "p99": rounded(percentile(present, 99)),
        "max": rounded(max(present)) if present else None,
    }


# --- text to LLM-like tokens -----------------------------------------------------------

_TOKEN = re.compile(r"\s*\w+|\s*[^\w\s]+")


def tokenize(text: str) -> list[str]:
    """Cut text the way LLM tokens look: words with their leading space, and
    punctuation on its own (``" Hello"``, ``","``).  Joined, they give the
    text back exactly (trailing whitespace aside)."""
    return _TOKEN.findall(text)
