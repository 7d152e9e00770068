"""HTTP to the replicas: one streamed ``POST /v1/audio/speech`` per segment,
with failover before the first audio byte.

What this module is for: what the relay asks of a replica and what its body
means.  The loop that tries replicas, the error ladder and the retry rules
are the pool's (``gateway.engines.pool.failover``: retried only while no
audio of the segment reached the sink, ``PartialAudioError`` after);
``wire`` decodes the body; this module's ``_Relay`` reads it, resamples it
when the body says another rate, and hands decoded audio to a ``Sink`` (the
engine's job).

* The sink's ``room`` is awaited before each chunk is delivered: while the
  session's budget is full the body is not read, so TCP flow control holds
  the upstream back rather than a buffer here.
* A voice only some replicas listed is sent to those (uploaded voices are
  per server).
* Each segment's audio is capped relative to its text (``audio_cap``:
  ``max_audio_base_s + max_audio_s_per_char x characters``, over
  ``speed``), and after the first byte it must come at ``min_delivery_rate``
  or faster (``FirstByte.paced``; waiting for the listener's room does not
  count); the pool's loop also bounds the whole body (``segment_timeout_s``).
* Nothing that is not audio is relayed: a 2xx whose ``Content-Type`` is not
  audio (a proxy's ``text/html`` page, a ``200`` JSON error) or whose
  ``X-Sample-Rate`` is impossible is a failed attempt
  (``wire.check_headers``), retried elsewhere like any failure before the
  first byte.
* A replica's own error text (an SSE error event) is passed on
  ``redact_text``-ed: no URLs, credentials or keys.
* A whole-file request (``stream: false``, the engine's way of asking for
  vllm-omni 0.30's word timestamps) is read as a raw audio body; its
  ``X-Word-Timestamps`` reach the sink just before its first audio, so an
  attempt that fails before any audio (and is retried) delivers none.

Errors never carry the replica's URL with credentials, an API key or a
traceback: ``pool.Replica.name`` is the redacted URL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import numpy as np
import numpy.typing as npt

from gateway.audio.resample import StreamResampler
from gateway.engines.base import WordTiming
from gateway.engines.pool.failover import (
    Attempt,
    BoundExceeded,
    Exchange,
    FirstByte,
    Wording,
    failover,
)
from gateway.engines.pool.replicas import ReplicaClient, redact_text
from gateway.engines.upstream.settings import UpstreamSettings
from gateway.engines.upstream.wire import (
    Format,
    ResponseDecoder,
    Samples,
    StreamFormat,
    UpstreamFailure,
    WireError,
    check_headers,
    word_timings,
)


class Sink(Protocol):
    """Where a segment's audio goes (the engine's job)."""

    async def room(self, seconds: float) -> bool:
        """Wait until ``seconds`` of audio may be delivered; False: stop."""

    def deliver(self, samples: npt.NDArray[np.float32]) -> bool:
        """Hand over audio at the segment's rate; False: stop."""

    def timings(self, words: tuple[WordTiming, ...]) -> None:
        """Hand over one request's word timings (ms from its audio's start),
        before its first audio."""


@dataclass
class Relayed(Attempt):
    """How one request went; ``delivered`` is in seconds of audio."""

    def progress(self) -> str:
        return f"{self.delivered * 1000:.0f} ms of this segment's audio"


#: how the relay's messages name its servers (they reach clients: unchanged)
WORDING = Wording(
    log_name="upstream",
    server="the upstream",
    none_could="no upstream replica could speak the segment",
    awaited=("first audio byte", "next audio"),
)


class UpstreamClient(ReplicaClient):
    """The pool of speech servers (``replicas.ReplicaClient``) and the
    segment relay."""

    settings: UpstreamSettings

    def __init__(
        self,
        settings: UpstreamSettings,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(settings, clock, transport)

    # --- choosing a replica --------------------------------------------------------------

    def _without_voice(self, voice: str) -> frozenset[int]:
        """Replicas known not to hold ``voice`` (uploaded voices are per server)."""
        wanted = voice.casefold()
        return frozenset(
            i
            for i, held in enumerate(self.replica_voices)
            if held is not None and held and wanted not in held
        )

    # --- one segment -----------------------------------------------------------------------

    async def speak(self, body: Mapping[str, Any], rate: int, sink: Sink) -> None:
        """Relay one segment's audio, at ``rate``, into ``sink``.  Raises
        ``SynthesisError`` (``PartialAudioError`` after audio was delivered)."""
        voice = str(body.get("voice", ""))
        tried = self._without_voice(voice)
        if len(tried) == len(self.bases):
            tried = frozenset()  # nobody listed it: let the upstreams answer
        cap = self.audio_cap(body)
        # a whole file (word timestamps) is a raw body, whatever the section streams
        stream_format: StreamFormat = (
            "audio" if body.get("stream") is False else self.settings.stream_format
        )

        def relay() -> _Relay:
            return _Relay(rate, sink, self.settings, cap, stream_format)

        await failover(self, body, relay, WORDING, tried)

    def audio_cap(self, body: Mapping[str, Any]) -> float:
        """Seconds of audio the segment of ``body`` may have."""
        config = self.settings
        speed = body.get("speed", 1.0)
        chars = len(str(body.get("input", "")))
        cap = config.max_audio_base_s + config.max_audio_s_per_char * chars
        return cap / speed if isinstance(speed, (int, float)) and speed > 0 else cap


class _Relay(Exchange[Relayed]):
    """One attempt's body: decoded, resampled to the segment's rate when the
    body says another rate, then handed to the sink."""

    path = "/v1/audio/speech"
    wire_error = WireError
    body = "speech audio"

    def __init__(
        self,
        rate: int,
        sink: Sink,
        settings: UpstreamSettings,
        cap_s: float,
        stream_format: StreamFormat,
    ) -> None:
        super().__init__(Relayed())
        self.settings = settings
        self.cap_s = cap_s
        self.first: FirstByte | None = None
        self.rate = rate
        self.sink = sink
        self.decoder = ResponseDecoder(stream_format, settings.response_format)
        self.response_format = settings.response_format
        self.stream_format = stream_format
        #: the body's word timings, handed over with its first audio
        self.words: tuple[WordTiming, ...] | None = None
        self.failure: UpstreamFailure | None = None
        self.problem: str | None = None  #: why the body ended early, if it did
        self._resampler: StreamResampler | None = None

    async def read(self, response: httpx.Response, first: FirstByte) -> bool:
        self.first = first
        declared = check_headers(
            response.headers.get("content-type"),
            response.headers.get("x-sample-rate"),
            self.stream_format,
        )
        self.words = word_timings(response.headers.get("x-word-timestamps"))
        if declared and self.response_format == "pcm":
            await self.handle(Format(declared, 1))
        async for piece in response.aiter_raw():
            for event in self.decoder.push(piece):
                if isinstance(event, Samples):
                    first.arrived()
                if not await self.handle(event):
                    return False
            if self.decoder.failed:
                break
        self.problem = self.decoder.finish()
        return True

    def finish(self) -> Relayed:
        if self.failure is not None:
            kind = "partial_audio" if self.failure.partial_audio else "upstream_error"
            message = redact_text(self.failure.message[:300])
            return self.failed(kind, f"the upstream reported: {message}")
        if self.problem is not None:
            return self.failed("truncated", self.problem)
        self.flush()
        return self.result

    async def handle(self, event: object) -> bool:
        if isinstance(event, Format):
            if event.sample_rate != self.rate:
                self._resampler = StreamResampler(event.sample_rate, self.rate)
            return True
        if isinstance(event, UpstreamFailure):
            self.failure = event
            return True
        if isinstance(event, Samples):
            samples = event.data
            if self._resampler is not None:
                samples = self._resampler.process(samples)
            return await self._deliver(samples)
        return True

    async def _deliver(self, samples: npt.NDArray[np.float32]) -> bool:
        if not samples.size:
            return True
        seconds = samples.size / self.rate
        if self.result.delivered + seconds > self.cap_s:
            raise BoundExceeded(
                "too_long",
                f"the upstream sent more than {self.cap_s:.1f} s of audio for a segment of"
                " this length (max_audio_base_s, max_audio_s_per_char)",
            )
        first = self.first
        if first is not None:
            first.hold()
        room = await self.sink.room(seconds)
        if first is not None:
            first.resume()
        if not room:
            return False
        if self.words is not None:  # before the audio they time
            self.sink.timings(self.words)
            self.words = None
        if not self.sink.deliver(samples):
            return False
        self.result.delivered += seconds
        if first is not None and self.settings.min_delivery_rate > 0:
            first.paced(
                self.result.delivered,
                self.settings.min_delivery_rate,
                self.settings.min_delivery_grace_s,
            )
        return True

    def flush(self) -> None:
        if self._resampler is not None:
            tail = self._resampler.flush()
            if tail.size and self.sink.deliver(tail):
                self.result.delivered += tail.size / self.rate
