"""The engine interface (v2): the one seam every speech model plugs into.

An engine turns text into float32 mono audio at a native rate, as a stream of
chunks.  The session layer does everything else (segmentation, framing,
encoding, resampling, flow control, the protocol), so an engine never sees a
WebSocket.  ``docs/engine.md`` ("Writing an engine") is the guide; this
module is the contract.

Shape:

* ``Engine.open_stream(StreamRequest)`` opens one ``EngineStream`` per
  *utterance* (voice, language, sample-rate hint, speed, instructions and
  options, alignment, label, the session's decode budget).  The stream may
  keep state across the utterance's segments (an LLM context, prosody).
* ``EngineStream.submit(SegmentRequest)`` hands it the utterance's segments
  (sentences or clauses from the segmenter) in order and returns one
  ``SynthesisJob`` per segment at once.  A job yields ``WordTimings`` (if
  asked for and the engine declares ``alignment``) and then ``AudioChunk``s;
  the speaker sends ``audio.start``/``audio.done`` around each job.
* ``EngineStream.cancel()`` stops the whole utterance, ``SynthesisJob.cancel()``
  one segment.
* ``Engine.capabilities`` is the one typed place where an engine says what it
  can do; validation and ``session.created`` read it.

Rules every engine follows:

* ``open_stream`` and ``submit`` never block the event loop and never raise:
  an engine that cannot speak a segment (unknown voice, engine not started,
  model error) reports it as a ``SynthesisError`` raised from that segment's
  iteration; the stream's next segment is still spoken.
* Model compute runs in worker threads, never on the event loop.
* Cancel is thread-safe and idempotent; after it returns the engine decodes
  at most the chunk already in flight, and a segment whose work has not
  started never starts it.
* A job that is neither iterated nor cancelled holds a bounded amount of
  decoded audio (``delivery.MAX_UNDELIVERED`` chunks), and a streamed
  utterance's decoded-unsent audio stays within the session's budget plus one
  chunk: the consumer's pace is the backpressure.
* Word timings are never delivered after the audio they describe.

The thread-to-loop delivery, the undelivered bound, cancel and the budget are
written once, in ``gateway.engines.delivery``; an engine uses them and holds
none of its own.

This module must not import torch, onnxruntime or any model package: the
session and the tests import it without loading a model.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from gateway.flow.capacity import Lateness

if TYPE_CHECKING:
    from gateway.settings import Settings
    from gateway.voices.store import StoredVoice, VoiceStore


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
    #: a voice uploaded to the gateway (``voice_store``) that the engine
    #: speaks by name, not one of its own: listed as ``uploaded``, deletable
    uploaded: bool = False


#: deprecated (docs/engine.md): an engine's declared input, passed on in
#: ``session.created`` and nothing else; the gateway segments the text for
#: every engine and submits it segment by segment, in order
InputGranularity = Literal["segments", "text_stream"]


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do, declared once (the validator, ``session.created``
    and the contract tests read it; nothing probes an engine with ``getattr``)."""

    #: native output rates in Hz of its voices (a chunk is at its voice's rate)
    sample_rates: tuple[int, ...]
    #: emits ``WordTimings`` for a segment when the stream asks for alignment
    alignment: bool = False
    #: can speak with a voice cloned from a reference recording
    cloning: bool = False
    #: honours free-form style instructions (``StreamRequest.instructions``)
    instructions: bool = False
    #: honours ``StreamRequest.speed`` other than 1.0 (an upstream only when
    #: its replicas do so on a stream: vllm-omni 0.30 refuses it otherwise)
    speed: bool = True
    #: BCP-47 tags of the languages its voices speak
    languages: tuple[str, ...] = ()
    input: InputGranularity = "segments"
    #: utterance streams it serves at once well (0: no own limit; admission
    #: is the gateway's ``max_active_streams``)
    max_concurrency: int = 0
    #: typical seconds from ``submit`` to a segment's first chunk on this
    #: host, alone: for schedulers and segmentation planners (not a promise)
    typical_first_chunk_s: float = 0.1
    #: reads numbers, dates, units and symbols itself: the gateway's text
    #: front-end then strips Markdown and emoji only (``docs/text.md``)
    normalizes_text: bool = False
    #: the engine's own inline markup, passed through the front-end verbatim
    #: (Orpheus' emotion tags ``<laugh>``, ...)
    markup_tags: tuple[str, ...] = ()
    #: ``StreamRequest.seed`` makes its sampled audio reproducible (the same
    #: text, voice and seed give the same samples)
    seed: bool = False
    #: the most engine text one work item reads, in ``work_item_unit``
    #: (bounded work per item, ``docs/engine.md``; 0: not declared)
    max_work_item: int = 0
    #: what ``max_work_item`` counts (Piper: ``phonemes``; ``characters``)
    work_item_unit: str = ""


class Budget(Protocol):
    """The session's bound on decoded but unsent audio (``max_buffered_ms``),
    shared by every job of a session.  The shared delivery machinery reserves
    a chunk's duration before the engine decodes it and the session releases
    it as the chunk is written to the socket.  Thread-safe.  The session's
    implementation is ``DecodeBudget``."""

    @property
    def full(self) -> bool: ...

    def reserve(self, holder: object, seconds: float, wake: Callable[[], None]) -> bool: ...

    def release(self, holder: object, seconds: float | None = None) -> None: ...


#: the ``StreamRequest.options`` an engine declaring ``cloning`` receives when
#: a client sends them (vllm-omni's voice-clone fields, checked by
#: ``gateway.session.validation.check_vllm_fields``)
CLONING_OPTIONS = (
    "task_type",
    "ref_audio",
    "ref_text",
    "x_vector_only_mode",
    "speaker_embedding",
    "ref_audio_2",
)


@dataclass(frozen=True)
class StreamRequest:
    """One utterance: what stays the same for all of its segments."""

    voice: str  #: a canonical ``VoiceInfo.name``
    #: BCP-47 tag the text is in; None: the voice's own language
    language: str | None = None
    #: deprecated (docs/engine.md): never set by the gateway, always None;
    #: kept so engines that read it keep working.  Chunks stay at the voice's
    #: native rate and the gateway resamples.
    sample_rate_hint: int | None = None
    speed: float = 1.0  #: 1.0 is the voice's own pace; 2.0 is twice as fast
    #: free-form style prompt; only for engines declaring ``instructions``
    instructions: str | None = None
    #: seeds the engine's sampling (engines declaring ``seed``); None: unseeded
    seed: int | None = None
    #: engine-specific options, passed through unchanged (never validated here)
    options: Mapping[str, object] = field(default_factory=dict)
    #: emit a ``WordTimings`` event before each segment's audio (engines
    #: declaring ``alignment``; others emit none)
    alignment: bool = False
    #: the utterance's first segment's first chunk jumps the queue (a live
    #: conversation); False for batch-like work (HTTP)
    first_audio_priority: bool = True
    #: free-form label for logs (session/context ids); never the text
    label: str = ""
    #: the session's bound on decoded but unsent audio; None: unbounded
    #: beyond the per-job look-ahead (``delivery.MAX_UNDELIVERED``)
    budget: Budget | None = None


@dataclass(frozen=True)
class SegmentRequest:
    """One segment of an utterance's text, submitted in order."""

    text: str
    #: ``time.monotonic()`` by which the listener needs this segment's first
    #: sample; engines with a scheduler serve earliest deadlines first
    deadline: float = 0.0


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
class SegmentStats:
    """Per-segment figures, engine-neutral (ms unless said otherwise).  The
    delivery machinery fills the common ones; an engine adds its own stages
    with ``add_stage`` (Piper: ``acoustic_ms``, ``decode_ms``, ...)."""

    queue_ms: float = 0.0  #: submit until the engine started work on it
    compute_ms: float = 0.0  #: model time spent on it (all stages)
    first_chunk_ms: float = 0.0  #: submit until the first chunk was produced
    #: chunks the engine produced (delivered, or dropped by a cancel while
    #: in flight): the contract tests bound its growth after cancel
    chunks: int = 0
    audio_samples: int = 0  #: delivered samples at the native rate
    #: the segment's whole duration in seconds, once the engine knows it
    #: (Piper: after the duration predictor); schedules the next segment
    audio_seconds: float | None = None
    cancelled: bool = False
    #: engine-specific stages (ms) and figures
    extra: dict[str, float] = field(default_factory=dict)

    def add_stage(self, stage: str, ms: float) -> None:
        """Count ``ms`` of model time to ``stage`` and to ``compute_ms``."""
        self.compute_ms += ms
        self.extra[stage] = self.extra.get(stage, 0.0) + ms


class SynthesisError(Exception):
    """The engine failed to synthesize one segment; the stream goes on.

    ``refused``: the engine judged the request itself invalid (an upstream
    answered 4xx other than 408/429, e.g. a reference audio it cannot read):
    the client's mistake, which the HTTP API answers with 400
    ``engine_refused`` rather than a server error."""

    def __init__(self, message: str, *, refused: bool = False, busy: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        #: capacity, not failure: no server could take the segment now (all
        #: full, ejected, unready or refusing connections); ``busy`` to clients
        self.busy = busy


class SynthesisJob(abc.ABC):
    """The stream of events for one submitted segment."""

    stats: SegmentStats

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        """Yield ``WordTimings`` (if asked and declared) then ``AudioChunk``s.

        Raises ``SynthesisError`` if the segment fails.  Ends quietly after
        ``cancel()``.  Leaving the iteration early cancels the job.
        """

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop work at the next chunk boundary.  Thread-safe, idempotent."""


class EngineStream(abc.ABC):
    """One utterance's segments, in order.  ``delivery.DeliveryStream`` is
    the base engines build on."""

    request: StreamRequest

    @abc.abstractmethod
    def submit(self, segment: SegmentRequest) -> SynthesisJob:
        """Queue the utterance's next segment; returns its job at once.
        Never blocks and never raises: failures come out of the job."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Cancel every segment submitted and not finished; later submits
        give jobs that end at once.  Thread-safe, idempotent."""

    @abc.abstractmethod
    def close(self) -> None:
        """No more segments will come (the utterance's text is complete):
        the engine may release per-utterance state once the submitted
        segments end.  Idempotent; does not cancel."""


def voice_named(voices: Sequence[VoiceInfo], name: str) -> VoiceInfo | None:
    """The voice called ``name`` (case-insensitive, spaces ignored), or None:
    the one lookup ``Engine.find_voice`` and ``session.config`` share."""
    wanted = name.strip().casefold()
    for voice in voices:
        if voice.name.casefold() == wanted:
            return voice
    return None


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

    @property
    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """What this engine can do (valid once ``start`` returned)."""

    @abc.abstractmethod
    def open_stream(self, request: StreamRequest) -> EngineStream:
        """Open one utterance's stream (never blocks, never raises)."""

    def default_voice(self) -> VoiceInfo:
        return self.voices()[0]

    def find_voice(self, name: str) -> VoiceInfo | None:
        """Case-insensitive lookup of a voice by name (``voice_named``)."""
        return voice_named(self.voices(), name)

    def ready(self) -> bool:
        """Able to serve now (``/readyz``, after ``start``).  An engine of
        remote servers says whether one is reachable; a local one always is."""
        return True

    def model_names(self) -> Sequence[str]:
        """Names clients may give as ``model`` besides the engine's own and
        OpenAI's (the upstream engine: its upstream's model)."""
        return ()

    def collectors(self) -> Sequence[object]:
        """Prometheus collectors of the engine's own figures; the app
        registers them on its registry (none by default)."""
        return ()

    def live_jobs(self) -> int:
        """Jobs submitted and not yet finished or cancelled (debug gauge)."""
        return 0

    def largest_work_item(self) -> int:
        """The largest work item run so far, in ``Capabilities.work_item_unit``
        (metrics gauge: checks the bound of ``max_work_item``); 0: none."""
        return 0

    # --- uploaded voices (optional) ---------------------------------------------------
    # An engine whose servers keep their own copies of uploaded voices (the
    # upstream engine: vllm-omni stores them per server) hears of each
    # upload and deletion here, and reads the store to restore copies.

    def use_voice_store(self, store: VoiceStore) -> None:  # noqa: B027 - optional hook
        """The gateway's store of uploaded voices, given before ``start``."""

    async def voice_added(self, voice: StoredVoice, audio: bytes) -> None:  # noqa: B027
        """An upload was stored.  Raise ``GatewayError`` to refuse it: the
        gateway then deletes it from the store again."""

    async def voice_removed(self, voice: StoredVoice) -> None:  # noqa: B027
        """An uploaded voice was deleted from the store."""

    def queue_depth(self) -> int:
        """Work items waiting for an engine worker (metrics gauge)."""
        return 0

    def take_lateness(self) -> Lateness | None:
        """Work finished since the last call, and how much of it finished
        after it was due because it waited behind other work: the load signal
        automatic admission follows (``gateway.flow.capacity``).  None: the
        engine's compute is not the gateway's (remote servers, paced test
        engines); admission then keeps a fixed number of slots."""
        return None
