"""When to commit the next segment: the listener-driven policy of ``auto``.

The segmenter (``gateway.text.segmenter``) knows where text *may* be cut; this
module decides when a cut below sentence level is worth its prosody cost.
It is pure: no I/O, no asyncio, no clock.  The caller passes the time and
how much audio lies ahead of the listener; the policy answers with the
segments to commit now, and with the time it wants to be asked again if no
text arrives (the session arms a timer for it).

The rule (``docs/segmentation.md``)
-----------------------------------
Let ``ahead`` be the audio the listener has not heard yet: audio sent and
unplayed plus the estimated audio of segments committed and not yet sent.
A segment committed now has its first audio ``lead`` seconds later (the
engine's time to first chunk), so the *slack* is ``ahead - lead``: how long
the policy can still wait for better text before the listener hears a gap.

* A sentence end is always cut (as in ``sentence`` mode); the first segment
  of an utterance also at its first clause boundary (as ``auto`` always did).
* In the unfinished sentence after that, a cut is made at the **earliest**
  decided place whose tier the slack has reached: a clause boundary when
  ``slack <= clause_slack_s``, a word boundary before a phrase (``and``,
  ``which``) when ``slack <= phrase_slack_s``, any other word boundary when
  ``slack <= margin_s``.  Phrase and word cuts need ``min_words`` words in
  the segment (``first_min_words`` for the first segment of an utterance).
* Each cut adds its estimated audio to ``ahead``, so the slack grows again
  and the rest of the sentence waits for its end.

At the start of an utterance ``ahead`` is zero, so the first segment leaves
at the first clause or after ``first_min_words`` words of a steady stream,
without waiting for a pause.  A word cut of the first segment also waits
until ``burst_s`` after the utterance's first text: text sent in a burst
(a whole sentence at once, word by word within a few milliseconds) reaches
its sentence end first and is not cut, while an LLM at 20 tokens/s needs
longer than that for four words anyway.

Invariance
----------
Each decision is a function of the text up to a candidate's look-ahead, the
time and ``ahead`` at that time; the earliest acceptable candidate is taken,
never "the best so far".  So splitting an increment into several pushes at
the same time, or asking again (``poll``) at extra times, gives the same
segments, provided the caller asks again at :meth:`SegmentPolicy.next_check`
(tested with hypothesis in ``tests/text/test_segment_policy.py``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final, Literal

from gateway.text.duration import estimate_seconds
from gateway.text.segmenter import Candidate, Segmenter, end_kind

__all__ = [
    "DEFAULT_LEAD_S",
    "LOAD_ALLOWANCE_S",
    "SUB_CLAUSE_KINDS",
    "Cut",
    "CutKind",
    "PolicyConfig",
    "SegmentPolicy",
]

CutKind = Literal["sentence", "clause", "phrase", "word", "other"]
#: cuts below clause level: counted, so that "cut every few words" shows
SUB_CLAUSE_KINDS: Final = frozenset({"phrase", "word"})

#: time to first chunk assumed when the engine does not declare one (Piper on
#: two CPU cores: about 100 ms alone, 300 ms with several sessions starting)
DEFAULT_LEAD_S: Final = 0.3
#: added to an engine's declared time to first chunk (alone) to plan with it
#: under load: a new utterance's first chunk may wait about this long behind
#: audio already playing in other sessions (Piper's scheduler allows 0.25 s)
LOAD_ALLOWANCE_S: Final = 0.25

#: a tolerance for float comparisons of times (a poll at the exact time
#: ``next_check`` gave must see the tier reached)
_EPS: Final = 1e-6


@dataclass(frozen=True)
class PolicyConfig:
    #: engine time to first chunk, seconds
    lead_s: float = DEFAULT_LEAD_S
    #: slack (seconds) at which any word boundary is cut: the safety margin
    #: for timer lateness and estimate errors
    margin_s: float = 0.2
    #: slack at which a word boundary before a phrase is cut
    phrase_slack_s: float = 0.45
    #: slack at which a clause boundary is cut
    clause_slack_s: float = 0.8
    #: words the first segment of an utterance needs for a word cut
    first_min_words: int = 4
    #: words a later segment needs for a phrase or word cut
    min_words: int = 4
    #: a word cut of the first segment waits this long after the first text
    burst_s: float = 0.15
    #: the session's speech rate (1 = normal), for ``text.duration.estimate_seconds``
    speed: float = 1.0
    #: longest wait between two checks while a candidate is pending
    recheck_s: float = 0.1

    def __post_init__(self) -> None:
        if self.first_min_words < 1 or self.min_words < 1:
            raise ValueError("minimum word counts must be at least 1")
        if not 0 <= self.margin_s <= self.phrase_slack_s <= self.clause_slack_s:
            raise ValueError("tiers must satisfy 0 <= margin <= phrase slack <= clause slack")
        if self.lead_s < 0 or self.burst_s < 0:
            raise ValueError("lead_s and burst_s must be >= 0")
        if self.speed <= 0 or self.recheck_s <= 0:
            raise ValueError("speed and recheck_s must be > 0")


@dataclass(frozen=True)
class Cut:
    """A committed segment and why it ends where it does."""

    text: str
    kind: CutKind


def _kind_of(text: str) -> CutKind:
    return end_kind(text) or "other"


class SegmentPolicy:
    """One context's segmentation: a :class:`Segmenter` plus, in ``auto``
    mode with ``timed``, the listener-driven early cuts."""

    def __init__(
        self, segmenter: Segmenter, config: PolicyConfig | None = None, *, timed: bool = True
    ) -> None:
        self.segmenter = segmenter
        self.config = config or PolicyConfig()
        #: early cuts happen only in ``auto`` with ``timed`` (streamed audio)
        self.timed = timed and segmenter.granularity == "auto"
        #: segments committed, by kind, since this policy was created
        self.counts: Counter[CutKind] = Counter()
        #: when the current utterance's first text arrived
        self._first_text_at: float | None = None
        #: text accepted and not yet looked at (``hold``), in arrival order
        self._held: list[str] = []

    @property
    def buffered(self) -> str:
        return self.segmenter.buffered + "".join(self._held)

    @property
    def holding(self) -> bool:
        """Text waits unread (``hold``) for the next push, poll or flush."""
        return bool(self._held)

    # --- the calls ---------------------------------------------------------
    def push(self, text: str, now: float, ahead_s: float) -> list[Cut]:
        """Accept a text increment at ``now``; return the segments to commit.

        ``ahead_s``: audio the listener has not heard yet, including the
        estimated audio of segments committed earlier and not yet sent."""
        self._note_first_text(text, now)
        cuts = [Cut(t, _kind_of(t)) for t in self.segmenter.push(self._take_held(text))]
        return self._decide(cuts, now, ahead_s)

    def hold(self, text: str, now: float) -> None:
        """Accept a text increment at ``now`` without looking at it: the
        held text is cut with the next :meth:`push`, :meth:`poll` or
        :meth:`flush`, as one increment with that call's text (sentence
        cuts are the same for any chunking; early cuts are decided then).
        For a session waiting at the server's door, whose segments cannot
        be spoken before it is let in: its text costs no work meanwhile."""
        self._note_first_text(text, now)
        if text:
            self._held.append(text)

    def poll(self, now: float, ahead_s: float) -> list[Cut]:
        """No new text: the segments the listener's buffer calls for now."""
        if self._held:
            return self.push("", now, ahead_s)
        return self._decide([], now, ahead_s)

    def flush(self) -> list[Cut]:
        """Everything buffered (``input.flush`` / ``input.done``)."""
        texts = self.segmenter.push(self._take_held("")) + self.segmenter.flush()
        cuts = [Cut(t, _kind_of(t)) for t in texts]
        self.counts.update(c.kind for c in cuts)
        return cuts

    def end_utterance(self) -> None:
        self.segmenter.end_utterance()
        self._first_text_at = None
        self._held.clear()

    def discard(self) -> str:
        self._first_text_at = None
        held = self._take_held("")
        return self.segmenter.discard() + held

    def next_check(self, now: float, ahead_s: float) -> float | None:
        """When to :meth:`poll` if no text arrives (None: only text helps)."""
        if not self.timed:
            return None
        slack = ahead_s - self.config.lead_s
        held = self._held_until(now)
        candidates = self._acceptable_candidates(None)
        times = [
            max(now + slack - self._tier(c), held if c.kind != "clause" else now)
            for c in candidates
        ]
        if not times:
            return None
        at = min(times)
        if at <= now:  # reached already, yet nothing was cut: check again soon
            at = now + self.config.recheck_s
        return min(at, now + self.config.recheck_s)

    # --- internals ---------------------------------------------------------
    def _note_first_text(self, text: str, now: float) -> None:
        if self._first_text_at is None and text and self.segmenter.awaiting_first_segment:
            self._first_text_at = now

    def _take_held(self, text: str) -> str:
        """The held text, then ``text``; nothing is held afterwards."""
        if not self._held:
            return text
        self._held.append(text)
        joined = "".join(self._held)
        self._held.clear()
        return joined

    def _estimate_s(self, text: str) -> float:
        return estimate_seconds(text, self.config.speed)

    def _tier(self, candidate: Candidate) -> float:
        """The slack at or below which ``candidate`` is cut."""
        c = self.config
        if candidate.kind == "clause":
            return c.clause_slack_s
        return c.phrase_slack_s if candidate.kind == "phrase" else c.margin_s

    def _held_until(self, now: float) -> float:
        """Word cuts of the first segment wait ``burst_s`` after its first text."""
        if self.segmenter.awaiting_first_segment and self._first_text_at is not None:
            return self._first_text_at + self.config.burst_s
        return now

    def _acceptable_candidates(self, now: float | None) -> list[Candidate]:
        """Candidates with enough words; with ``now``, only those not held."""
        c = self.config
        first = self.segmenter.awaiting_first_segment
        min_words = c.first_min_words if first else c.min_words
        held = now is not None and now + _EPS < self._held_until(now)
        return [
            cand
            for cand in self.segmenter.candidates()
            if cand.kind == "clause" or (cand.words >= min_words and not held)
        ]

    def _decide(self, cuts: list[Cut], now: float, ahead_s: float) -> list[Cut]:
        lead = self.config.lead_s
        # when the listener runs dry if nothing more is committed
        dry = now + max(0.0, ahead_s)
        for cut in cuts:
            dry = max(dry, now + lead) + self._estimate_s(cut.text)
        while self.timed:
            slack = dry - now - lead
            if slack > self.config.clause_slack_s + _EPS:
                break  # above the highest tier no candidate is cut: none is looked for
            pick = next(
                (c for c in self._acceptable_candidates(now) if slack <= self._tier(c) + _EPS),
                None,
            )
            if pick is None:
                break
            text = self.segmenter.cut_at(pick.end)
            cuts.append(Cut(text, pick.kind))
            dry = max(dry, now + lead) + self._estimate_s(text)
        self.counts.update(c.kind for c in cuts)
        return cuts
