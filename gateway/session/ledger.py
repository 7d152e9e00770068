"""The audio ledger: what a session's audio streams produced and sent, per
context, utterance and segment.

One writer.  Only the audio stream (``gateway.session.audio_stream``) writes
these records, as it speaks: a segment's audio began, its word timings
arrived, a message of its audio went out (with its sequence number, its
sample offset, its bytes and samples), its engine job ended, its audio is
complete.  The session core only reads them: the cancel reports
(``gateway.session.cancel_report``, ``Utterance.heard_split``), the figures
of ``audio.done`` and ``session.done`` (``Utterance.metrics``) and the audio
ahead of the listener that the segmentation policy plans with.  The text
side of the same things (the client's text, the segments committed, the
front-end's reading, the slots) stays in the core's records
(``gateway.session.utterance``, ``gateway.session.contexts``), which the
stream only reads.

Each record hangs from the text-side record it describes (``Context.audio``,
``Utterance.audio``, ``Segment.audio``), created empty with it, so a reader
finds it without a lookup and a forgotten context takes its ledger along.

What was acknowledged is the listener's (``gateway.flow.listener.Listener``:
``playback`` reports under every flow-control mode, ``ack``'s window); the
stream counts each frame there as it admits it.  It is not copied here: a
record has one writer.

Sequence numbers count the binary messages of tagged framing only
(``docs/protocol.md``: per context, +1 per binary message, WAV headers
included; raw framing's messages carry no number and do not move it).
vllm-omni 0.30's JSON ``audio.chunk`` frames (``word_timestamps``) are
events, not binary messages: they never move the sequence.  Found at
289b9b6: the core moved the sequence for every message of a tagged session,
chunks included, but ``word_timestamps`` is refused with any framing but
``raw`` (``session.config._check_word_timestamps``), so no chunk was ever
counted; ``ContextAudio.message_sent`` keeps that rule itself
(``numbered``) rather than relying on the config check.  The chunks do
count as audio sent (their samples, ``sent_ms``, the listener's position),
as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.engines.base import SegmentStats, WordTiming
from gateway.text.frontend import SpokenSegment
from gateway.text.stage import SourceWord, source_words


@dataclass(eq=False)
class SegmentAudio:
    """One segment's audio: where it sits in its utterance and what of it
    was sent."""

    started: bool = False  #: its ``audio.start`` was sent
    finished: bool = False  #: its ``audio.done`` was sent
    #: where its audio begins, in ms from the utterance's first sample
    start_ms: float = 0.0
    audio_ms: float = 0.0  #: its length, once finished
    words: tuple[WordTiming, ...] | None = None  #: segment-relative timings
    #: ``words`` on the client's text (segment-relative offsets)
    source_words: tuple[SourceWord, ...] = ()
    #: the sequence number of its first binary message (tagged framing;
    #: None: none was sent, or raw framing)
    first_sequence: int | None = None
    #: the utterance's sample offset of its first sample (at the output rate)
    start_sample: int = 0
    messages: int = 0  #: messages of it sent (binary, or ``audio.chunk`` events)
    sent_bytes: int = 0  #: payload bytes sent (headers not counted)
    samples: int = 0  #: samples sent, at the output rate

    def add_words(
        self, words: tuple[WordTiming, ...], spoken: SpokenSegment
    ) -> tuple[SourceWord, ...]:
        """Keep the engine's word timings and their mapping on the client's
        text (``spoken``: the segment's spoken form); returns the mapping of
        ``words``.  A segment whose engine text is over the engine's work
        item is timed piece by piece (each piece's timings before its audio,
        times from the segment's start): later timings add to the earlier
        ones."""
        known = len(self.source_words)
        self.words = (*(self.words or ()), *words)
        self.source_words = source_words(spoken, self.words)
        return self.source_words[known:]


@dataclass(eq=False)
class UtteranceAudio:
    """One utterance's audio: what was sent, and the engine's figures."""

    sent_ms: float = 0.0  #: audio sent so far
    samples: int = 0  #: samples sent so far, at the output rate
    #: when its first samples went out (time.monotonic)
    first_audio_at: float | None = None
    compute_ms: float = 0.0  #: the engine's compute over its segments
    queue_ms: float | None = None  #: its first segment's wait in the engine's queue

    def start_segment(self, segment: SegmentAudio) -> None:
        """``segment``'s ``audio.start`` goes out: its audio begins here."""
        segment.started = True
        segment.start_ms = self.sent_ms
        segment.start_sample = self.samples

    def count_sent(self, segment: SegmentAudio, samples: int, rate: int, now: float) -> bool:
        """``samples`` of ``segment``'s audio at ``rate`` went out at ``now``;
        True if these were the utterance's first."""
        if not samples:
            return False
        segment.samples += samples
        self.sent_ms += samples * 1000 / rate
        self.samples += samples
        if self.first_audio_at is not None:
            return False
        self.first_audio_at = now
        return True

    def account(self, stats: SegmentStats) -> None:
        """A segment's engine job ended: its compute and queue time."""
        self.compute_ms += stats.compute_ms
        if self.queue_ms is None:
            self.queue_ms = stats.queue_ms

    def finish_segment(self, segment: SegmentAudio, rate: int) -> None:
        """``segment``'s ``audio.done`` goes out, after its samples at ``rate``."""
        segment.audio_ms = segment.samples * 1000 / rate
        segment.finished = True


@dataclass(eq=False)
class ContextAudio:
    """One context's messages of audio, across its utterances."""

    #: the next binary message's sequence number (tagged framing)
    sequence: int = 0

    def message_sent(self, segment: SegmentAudio, payload: bytes, *, numbered: bool) -> None:
        """A message of ``segment``'s audio went out: ``numbered``, a binary
        message of tagged framing (its sequence number was ``sequence``);
        else a raw binary message or an ``audio.chunk`` event, which take none."""
        if numbered:
            if segment.first_sequence is None:
                segment.first_sequence = self.sequence
            self.sequence += 1
        segment.messages += 1
        segment.sent_bytes += len(payload)
