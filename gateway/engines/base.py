"""The engine interface: the one small seam every speech model plugs into.

An engine turns one *segment* of text (a sentence or clause chosen by the
segmenter) into float32 mono audio at the voice's native rate, as a stream of
chunks.  The session layer does everything else (framing, encoding,
resampling, flow control, the protocol), so an engine never sees a WebSocket.

Rules every engine follows:

* ``submit`` never blocks the event loop.  It may start work at once (the
  acoustic model of a queued segment runs while the previous segment is still
  decoding: that is how segments join without a gap).
* Model compute runs in worker threads, never on the event loop.
* ``SynthesisJob.cancel`` is thread-safe and idempotent; after it returns the
  engine decodes at most the chunk already in flight, and a job whose
  acoustic work has not started never starts it.
* A job that is neither iterated nor cancelled holds a bounded amount of
  decoded audio: the consumer's pace is the backpressure.

This module must not import torch, onnxruntime or any model package: the
session and the tests import it without loading a model.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

# re-exported: engines import the session buffer from here (it lives in gateway.flow)
from gateway.flow.budget import DecodeBudget as DecodeBudget

if TYPE_CHECKING:
    from gateway.settings import Settings


@dataclass(frozen=True)
class VoiceInfo:
    """A voice an engine can speak with, as listed to clients."""

    name: str  #: canonical, case-insensitive id used in ``session.config.voice``
    language: str  #: BCP-47 tag, e.g. ``en-US``
    language_name: str  #: English name of the language, e.g. ``English``
    sample_rate: int  #: native output rate in Hz
    quality: str = "medium"
    streaming: bool = True  #: audio is decoded incrementally, chunk by chunk
    engine: str = ""
    description: str = ""
    #: other spellings accepted for the language (Piper code ``en_US`` ...)
    language_aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class SynthesisRequest:
    """One segment of text to speak."""

    text: str
    voice: str  #: a canonical ``VoiceInfo.name``
    speed: float = 1.0  #: 1.0 is the voice's own pace; 2.0 is twice as fast
    alignment: bool = False  #: emit a ``WordTimings`` event before the audio
    #: ``time.monotonic()`` by which the listener needs this segment's first
    #: sample; the decode worker serves earliest deadlines first.
    deadline: float = 0.0
    #: this segment opens an utterance: its first chunk jumps the queue.
    first_in_utterance: bool = False
    #: free-form label for logs (session/context ids); never the text.
    label: str = ""
    #: the session's bound on decoded but unsent audio; None: unbounded
    #: beyond the engine's own small look-ahead
    budget: DecodeBudget | None = None


@dataclass(frozen=True)
class WordTiming:
    word: str
    start_ms: float  #: from the start of the segment's audio
    end_ms: float


@dataclass(frozen=True)
class WordTimings:
    """Word alignment of a segment; emitted before its first ``AudioChunk``."""

    words: tuple[WordTiming, ...]


@dataclass(frozen=True)
class AudioChunk:
    """Decoded audio: float32 mono in [-1, 1] at the voice's native rate."""

    samples: np.ndarray


EngineEvent = WordTimings | AudioChunk


@dataclass
class JobStats:
    """Per-segment timings, filled in by the engine as work happens (ms)."""

    queue_ms: float = 0.0  #: submit until acoustic work started
    acoustic_ms: float = 0.0  #: text to latent (all acoustic stages)
    first_chunk_ms: float = 0.0  #: submit until the first chunk was decoded
    decode_ms: float = 0.0  #: total vocoder time
    chunks_decoded: int = 0  #: counted inside the decode worker
    chunks_after_cancel: int = 0  #: chunks whose decode began after cancel()
    audio_samples: int = 0
    #: the segment's whole duration in seconds, once the engine knows it
    #: (Piper: after the duration predictor); schedules the next segment
    audio_seconds: float | None = None
    cancelled: bool = False
    extra: dict[str, float] = field(default_factory=dict)


class SynthesisError(Exception):
    """The engine failed to synthesize one segment; the session goes on."""


class SynthesisJob(abc.ABC):
    """The stream of events for one submitted segment."""

    stats: JobStats

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        """Yield ``WordTimings`` (if asked and available) then ``AudioChunk``s.

        Raises ``SynthesisError`` if the segment fails.  Ends quietly after
        ``cancel()``.
        """

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop work at the next chunk boundary.  Thread-safe, idempotent."""


class Engine(abc.ABC):
    """A speech model behind the gateway.  Created by the registry, started
    in the app's lifespan, shared by every session."""

    #: registry name, e.g. ``piper``
    name: str = ""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @abc.abstractmethod
    async def start(self) -> None:
        """Load models and warm them up (off the event loop)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release workers and models."""

    @abc.abstractmethod
    def voices(self) -> Sequence[VoiceInfo]:
        """The voices this engine serves, default voice first."""

    @abc.abstractmethod
    def submit(self, request: SynthesisRequest) -> SynthesisJob:
        """Queue a segment and return its job at once (never blocks)."""

    def default_voice(self) -> VoiceInfo:
        return self.voices()[0]

    def find_voice(self, name: str) -> VoiceInfo | None:
        """Case-insensitive lookup of a voice by name."""
        wanted = name.strip().casefold()
        for voice in self.voices():
            if voice.name.casefold() == wanted:
                return voice
        return None

    def live_jobs(self) -> int:
        """Jobs submitted and not yet finished or cancelled (debug gauge)."""
        return 0

    def queue_depth(self) -> int:
        """Work items waiting for an engine worker (metrics gauge)."""
        return 0
