"""HTTP to the replicas: one streamed ``POST /v1/audio/speech`` per segment,
with failover before the first audio byte.

What this module is for: the I/O around the pure parts.  ``pool.Pool``
decides where a request goes and what an outcome means; ``wire`` decodes the
body; this module sends requests with one shared ``httpx.AsyncClient``
(HTTP/1.1 keep-alive connections, pooled per replica), reports outcomes and
times to the pool, and hands decoded audio to a ``Sink`` (the engine's job).

Rules:

* A segment's request is retried on another replica only while no audio of
  it reached the sink: connection refused/reset, a timeout before the first
  audio byte, 408/5xx (a failure), 429/503 (the replica is full), a body that
  ended or failed before any audio, a response declared as something that
  is not speech audio (``wire.check_headers``: a ``text/html`` error page, a
  ``200`` JSON error, an impossible ``X-Sample-Rate``).  A 4xx that is the request's own fault
  fails the segment at once, with the upstream's message.
* After the first audio byte, any failure (a cut body, an SSE error event, a
  read timeout) fails the segment with ``PartialAudioError``: the listener
  has heard part of it, and repeating it elsewhere would speak it twice.
* Cancel is task cancellation: the ``CancelledError`` reaches the read in
  progress and closing the response closes its connection (a partly read
  response is never returned to the keep-alive pool), so the upstream sees
  the disconnect at once and stops generating.  The close is shielded: a
  cancel arriving while it runs (the sink refused a chunk of the cancelled
  job first, then the task cancel came) must not cut it short.
* The sink's ``room`` is awaited before each chunk is delivered: while the
  session's budget is full the body is not read, so TCP flow control holds
  the upstream back rather than a buffer here.

Errors never carry the replica's URL with credentials, an API key or a
traceback: ``pool.Replica.name`` is the redacted URL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import numpy as np
import numpy.typing as npt

from gateway.audio.resample import StreamResampler
from gateway.engines.base import SynthesisError
from gateway.engines.pool.replicas import ReplicaClient, read_error, redact_text
from gateway.engines.pool.routing import Outcome, classify_status
from gateway.engines.upstream.wire import (
    Format,
    ResponseDecoder,
    Samples,
    UpstreamFailure,
    WireError,
    check_headers,
)
from gateway.settings import UpstreamSettings

log = logging.getLogger(__name__)


class PartialAudioError(SynthesisError):
    """The upstream failed after part of the segment's audio was delivered."""


class Sink(Protocol):
    """Where a segment's audio goes (the engine's job)."""

    async def room(self, seconds: float) -> bool:
        """Wait until ``seconds`` of audio may be delivered; False: stop."""

    def deliver(self, samples: npt.NDArray[np.float32]) -> bool:
        """Hand over audio at the segment's rate; False: stop."""


@dataclass
class Attempt:
    """How one request to one replica went."""

    outcome: Outcome
    kind: str  #: failure kind for metrics (``connect``, ``timeout``, ``http_503``...)
    message: str = ""
    delivered: float = 0.0  #: seconds of audio delivered to the sink
    stopped: bool = False  #: the sink asked to stop (cancel)


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
        last = "no upstream replica is available"
        for _ in range(self.settings.max_attempts):
            index = await self._choose(tried)
            if index is None:
                break
            tried |= {index}
            attempt = await self._attempted(index, self._attempt(index, body, rate, sink))
            if attempt.outcome is Outcome.OK or attempt.stopped:
                return
            name = self.pool.replicas[index].name
            if attempt.delivered > 0:
                log.warning("upstream %s failed mid-segment: %s", name, attempt.message)
                raise PartialAudioError(
                    f"the upstream failed after {attempt.delivered * 1000:.0f} ms of this"
                    f" segment's audio: {attempt.message}"
                )
            if attempt.outcome is Outcome.CLIENT_ERROR:
                raise SynthesisError(
                    f"the upstream refused the segment: {attempt.message}", refused=True
                )
            log.info("upstream %s: %s; trying another replica", name, attempt.message)
            last = attempt.message
        raise SynthesisError(f"no upstream replica could speak the segment: {last}")

    async def _attempt(self, index: int, body: Mapping[str, Any], rate: int, sink: Sink) -> Attempt:
        url = f"{self.bases[index]}/v1/audio/speech"
        sent = self.clock()
        decoder = ResponseDecoder(self.settings.stream_format, self.settings.response_format)
        state = _Relay(rate, sink)
        try:
            async with asyncio.timeout(self.settings.first_byte_timeout_s) as first_byte:
                request = self.http.build_request("POST", url, json=dict(body))
                response = await self.http.send(request, stream=True)
                try:
                    if not 200 <= response.status_code < 300:
                        return await _refused(response)
                    declared = check_headers(
                        response.headers.get("content-type"),
                        response.headers.get("x-sample-rate"),
                        self.settings.stream_format,
                    )
                    if declared and self.settings.response_format == "pcm":
                        await state.handle(Format(declared, 1))
                    async for piece in response.aiter_raw():
                        for event in decoder.push(piece):
                            if isinstance(event, Samples) and not state.audio_seen:
                                state.audio_seen = True
                                first_byte.reschedule(None)  # audio flows: no deadline
                                self.ttfb[index].observe(self.clock() - sent)
                            if not await state.handle(event):
                                return Attempt(Outcome.OK, "", stopped=True)
                        if decoder.failed:
                            break
                    problem = decoder.finish()
                finally:
                    # shielded: the session's cancel (a task cancel) often
                    # lands while the sink's refusal already returned here,
                    # and a close interrupted inside httpcore leaves the
                    # connection open: the upstream would speak on
                    await asyncio.shield(response.aclose())
        except TimeoutError:
            what = "first audio byte" if state.delivered == 0 else "next audio"
            return state.failed("timeout", f"no {what} within the timeout")
        except httpx.TimeoutException:
            return state.failed("timeout", "the upstream stopped sending")
        except httpx.ConnectError:
            return state.failed("connect", "the replica refused the connection")
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            return state.failed("disconnect", "the replica closed the connection mid-response")
        except httpx.HTTPError as exc:
            return state.failed("http", f"HTTP error {type(exc).__name__}")
        except WireError as exc:
            return state.failed("body", f"the response is not speech audio: {exc}")
        if state.failure is not None:
            kind = "partial_audio" if state.failure.partial_audio else "upstream_error"
            message = redact_text(state.failure.message[:300])
            return state.failed(kind, f"the upstream reported: {message}")
        if problem is not None:
            return state.failed("truncated", problem)
        state.flush()
        return Attempt(Outcome.OK, "", delivered=state.delivered)


class _Relay:
    """One attempt's audio: resampled to the segment's rate when the body
    says another rate, then handed to the sink."""

    def __init__(self, rate: int, sink: Sink) -> None:
        self.rate = rate
        self.sink = sink
        self.delivered = 0.0
        self.audio_seen = False  #: the body's first samples arrived
        self.failure: UpstreamFailure | None = None
        self._resampler: StreamResampler | None = None

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
        if not await self.sink.room(seconds):
            return False
        if not self.sink.deliver(samples):
            return False
        self.delivered += seconds
        return True

    def flush(self) -> None:
        if self._resampler is not None:
            tail = self._resampler.flush()
            if tail.size and self.sink.deliver(tail):
                self.delivered += tail.size / self.rate

    def failed(self, kind: str, message: str) -> Attempt:
        return Attempt(Outcome.FAILURE, kind, message, self.delivered)


async def _refused(response: httpx.Response) -> Attempt:
    """An HTTP error status: its outcome, and the upstream's message."""
    outcome = classify_status(response.status_code)
    return Attempt(outcome, f"http_{response.status_code}", await read_error(response))
