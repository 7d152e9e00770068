"""What one utterance has accepted, spoken and sent: pure bookkeeping.

An utterance is the text of one context between its first ``input.text`` and
its ``input.done`` (or cancel).  This module answers the question a barge-in
needs: given the listener's position, which text was heard and which was
not, so that every accepted character is accounted for.

These are the text side of an utterance and its segments, and the session
core is their one writer; the stream only reads them.  Their audio side
(where each segment's audio sits, what was sent, the word timings, the
engine's figures) is the audio ledger (``gateway.session.ledger``:
``Utterance.audio``, ``Segment.audio``), which only the audio stream
writes and this module reads.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway import protocol
from gateway.errors import ErrorCode
from gateway.protocol import EffectiveConfig
from gateway.session.ledger import SegmentAudio, UtteranceAudio
from gateway.text.frontend import FrontEnd, FrontEndError, Span, SpokenSegment
from gateway.text.stage import EngineTextBudget, empty_spoken


@dataclass(frozen=True)
class Refusal:
    """Why a committed segment is not spoken (reported in its ``error``,
    ``action: "sentence_skipped"``): malformed SSML, or the utterance's
    engine text over ``max_utterance_engine_chars``."""

    code: ErrorCode
    message: str  #: complete, for the client


@dataclass(eq=False)
class Segment:
    """A piece of the utterance's text committed to the engine (a sentence,
    or a clause or phrase the segmentation policy cut early; the protocol
    calls it a sentence: ``sentence_index``).  ``text`` is the client's
    text; ``spoken`` what the engine reads (the front-end's form); ``audio``
    its audio (the ledger, written by the stream)."""

    index: int
    text: str
    #: the front-end's spoken form (None: the engine reads ``text``)
    spoken: SpokenSegment | None = None
    #: where ``text`` starts in the utterance's client text
    source_start: int = 0
    #: the segment is refused (malformed SSML, the engine-text budget):
    #: nothing is spoken
    refused: Refusal | None = None
    #: its audio: the ledger's record, written by the audio stream only
    audio: SegmentAudio = field(default_factory=SegmentAudio)

    @property
    def engine_text(self) -> str:
        """What the engine reads for this segment ("": nothing)."""
        return self.text if self.spoken is None else self.spoken.text

    @property
    def spoken_form(self) -> SpokenSegment:
        """The spoken form, the client's text itself when the engine reads it
        as written (what word timings are mapped through)."""
        return self.spoken or _verbatim(self.text)


def _verbatim(text: str) -> SpokenSegment:
    return SpokenSegment(source=text, text=text, spans=(Span(0, len(text), 0, len(text)),))


@dataclass(eq=False)
class Utterance:
    index: int
    config: EffectiveConfig
    #: engine options in force when it started (voice-clone fields)
    options: Mapping[str, object] = field(default_factory=dict)
    accepted_chars: int = 0
    segments: list[Segment] = field(default_factory=list)
    done_received: bool = False  #: ``input.done`` arrived
    cancelled: bool = False
    #: the text front-end of this utterance (None: the engine reads the
    #: client's text as it is)
    frontend: FrontEnd | None = None
    #: every ``input.text`` of the utterance, joined (the client's text)
    source_text: str = ""
    #: a segment was refused (malformed SSML: the markup state is unknown;
    #: the engine-text budget spent): the utterance's later text is
    #: reported but not spoken
    frontend_failed: bool = False
    #: the engine text its segments may read in all (None: no limit)
    engine_budget: EngineTextBudget | None = None
    #: markup left open at the end of the text (``finish_reading``)
    unclosed: FrontEndError | None = None
    #: the front-end's reading of the committed segments, in order (a chain
    #: of worker-thread calls, ``AudioStream``); None: nothing pending
    reading: asyncio.Future[None] | None = None
    _located: int = 0  #: end of the last segment found in ``source_text``
    _frontend_chars: int = 0  #: characters handed to the front-end so far
    #: streams: it has committed text being synthesized or queued, within its
    #: session's ``max_streams_per_session`` (``SessionDoor.take``;
    #: committed text waiting for the door or the share is ``SessionDoor.waiting``)
    holds_slot: bool = False
    unsent_text: str = ""  #: text discarded from the segmenter by a cancel
    flow_offset_ms: float = 0.0  #: the context's sent position when this utterance began
    # timings (time.monotonic) for session.done metrics
    first_text_at: float = 0.0
    ready_at: float | None = None  #: first segment became speakable
    #: its first committed segment waited this long at the door
    admission_wait_ms: float = 0.0
    #: its audio: the ledger's record, written by the audio stream only
    audio: UtteranceAudio = field(default_factory=UtteranceAudio)

    def metrics(self) -> protocol.UtteranceMetrics:
        """The in-band timings carried by ``session.done``."""
        audio = self.audio
        first_audio_ms = None
        if audio.first_audio_at is not None and self.ready_at is not None:
            first_audio_ms = round((audio.first_audio_at - self.ready_at) * 1000, 3)
        return protocol.UtteranceMetrics(
            queue_ms=round(audio.queue_ms or 0.0, 3),
            first_audio_ms=first_audio_ms,
            audio_ms=round(audio.sent_ms, 3),
            compute_ms=round(audio.compute_ms, 3),
            compute_rtf=round(audio.compute_ms / audio.sent_ms, 4) if audio.sent_ms else 0.0,
            sentences=len(self.segments),
            admission_wait_ms=round(self.admission_wait_ms, 3),
        )

    def audio_done(
        self,
        context_id: str | None,
        segment: Segment,
        total_bytes: int,
        *,
        error: bool = False,
        cancelled: bool = False,
    ) -> protocol.AudioDone:
        return protocol.AudioDone(
            context_id=context_id,
            utterance_index=self.index,
            sentence_index=segment.index,
            total_bytes=total_bytes,
            audio_ms=round(segment.audio.audio_ms, 3),
            error=error,
            cancelled=cancelled,
        )

    def session_done(self, context_id: str | None, cancelled: bool = False) -> protocol.SessionDone:
        return protocol.SessionDone(
            context_id=context_id,
            utterance_index=self.index,
            total_sentences=len(self.segments),
            cancelled=cancelled,
            metrics=self.metrics(),
        )

    def add_segment(self, text: str) -> Segment:
        """A committed piece of text becomes the utterance's next segment,
        located in the client's text.  Its spoken form comes from ``read``
        (off the event loop: ``AudioStream`` runs it in a worker thread, in
        order)."""
        found = self.source_text.find(text, self._located) if text else -1
        start = self._located if found < 0 else found
        self._located = start + len(text)
        segment = Segment(index=len(self.segments), text=text, source_start=start)
        self.segments.append(segment)
        return segment

    # --- the text front-end (called in a worker thread, one call at a time) --------
    def read(self, segment: Segment) -> None:
        """The front-end's spoken form of ``segment`` (segments are read in
        order).  Malformed markup refuses the segment, and the utterance's
        later text is reported but not spoken (its markup state is unknown)."""
        if self.frontend is None:
            return
        if self.frontend_failed:
            segment.spoken = empty_spoken(segment.text)
            return
        before = self._frontend_chars
        self._frontend_chars += len(segment.text)
        try:
            spoken = self.frontend.process(segment.text)
        except FrontEndError as exc:
            local = min(len(segment.text), max(0, exc.position - before))
            at = segment.source_start + local
            message = f"{exc.message} (at character {at} of the utterance's text)"
            segment.refused = Refusal(ErrorCode.INVALID_SSML, message)
            segment.spoken = empty_spoken(segment.text)
            self.frontend_failed = True
            return
        budget = self.engine_budget
        if budget is not None and not budget.take(spoken):
            message = f"{budget.message}; it and the rest of the utterance are not spoken"
            segment.refused = Refusal(ErrorCode.TEXT_TOO_LONG, message)
            segment.spoken = empty_spoken(segment.text)
            self.frontend_failed = True
            return
        segment.spoken = spoken

    def finish_reading(self) -> None:
        """The utterance's text is complete: markup left open (SSML) is
        ``unclosed``, reported before its ``session.done``."""
        if self.frontend is None or self.frontend_failed:
            return
        try:
            self.frontend.finish()  # carries no text (gateway.text.frontend)
        except FrontEndError as exc:
            self.unclosed = FrontEndError(exc.message, len(self.source_text))

    def heard_split(self, position_ms: float, buffered: str) -> tuple[str, str]:
        """Split the utterance's text into (spoken, unspoken) at a position.

        With word timings a word counts as spoken if it started before the
        position; without, a segment counts only if all of it was before the
        position.  Text still in the segmenter (``buffered``) is unspoken.
        The spoken text is a prefix: once some text is unspoken, so is all
        after it (a silent segment after a half-heard one was not heard).
        """
        spoken: list[str] = []
        unspoken: list[str] = []
        for segment in self.segments:
            audio = segment.audio
            if not audio.started or unspoken:
                unspoken.append(segment.text)
                continue
            if audio.words:
                heard, rest = _split_words(segment.text, audio, position_ms)
                if heard:
                    spoken.append(heard)
                if rest:
                    unspoken.append(rest)
            elif audio.finished and audio.start_ms + audio.audio_ms <= position_ms:
                spoken.append(segment.text)
            else:
                unspoken.append(segment.text)
        if buffered.strip():
            unspoken.append(buffered.strip())
        return " ".join(spoken), " ".join(unspoken)


def _split_words(text: str, segment: SegmentAudio, position_ms: float) -> tuple[str, str]:
    """Cut a segment's text after the last word that started before the
    position, keeping the original characters (punctuation included).

    The engine's words are found in the text verbatim, in order.  When they
    are not (an engine that normalises ``42`` to ``forty two``), the text's
    whitespace tokens stand in for them, matched by count (proportionally if
    the counts differ)."""
    words = segment.words
    assert words is not None
    if segment.source_words:  # the front-end's offset map
        heard_words = [
            w for w in segment.source_words if segment.start_ms + w.start_ms < position_ms
        ]
        if not heard_words:
            return "", text.strip()
        cut = heard_words[-1].char_end
        while cut < len(text) and not text[cut].isspace():
            cut += 1
        return text[:cut].strip(), text[cut:].strip()
    heard = 0
    for word in words:
        if segment.start_ms + word.start_ms >= position_ms:
            break
        heard += 1
    if heard == 0:
        return "", text.strip()
    ends = _verbatim_ends(text, [w.word for w in words[:heard]])
    if ends is not None:
        cut = ends[-1]
    else:
        tokens = [match.end() for match in re.finditer(r"\S+", text)]
        if not tokens:
            return "", text.strip()
        index = round(heard * len(tokens) / len(words))
        cut = tokens[min(len(tokens), max(1, index)) - 1]
    return text[:cut].strip(), text[cut:].strip()


def _verbatim_ends(text: str, words: list[str]) -> list[int] | None:
    """Where each word ends in ``text`` (trailing punctuation glued to it),
    or None if a word is not there verbatim."""
    ends: list[int] = []
    cursor = 0
    for word in words:
        found = text.find(word, cursor)
        if found < 0:
            return None
        cursor = found + len(word)
        end = cursor
        while end < len(text) and not text[end].isspace():
            end += 1
        ends.append(end)
    return ends
