"""The one failover loop of the remote engines: a segment's request, tried
on the pool's replicas one after another until one answers, never again
once part of its result reached the engine.

What this module is for: what every engine that sends one streamed ``POST``
per segment to a ``replicas.ReplicaClient`` shares: choosing replicas
(``ReplicaClient.choose``), sending the request with the first-byte
deadline, turning an error status and every transport error into an
``Attempt`` with the outcome the pool learns from (``routing.Outcome``),
and the rules below.  What a body means is the engine's: an ``Exchange``
reads it (the upstream relay's audio, the orpheus engine's tokens) and
says how far it got.

Rules:

* A segment's request is retried on another replica only while nothing of
  it reached the engine: connection refused/reset, a timeout before the
  first byte, 408/5xx (a failure), 429/503 (the replica is full), a body
  that ended or failed before any data.  A 4xx that is the request's own
  fault fails the segment at once, with the server's message
  (``SynthesisError(refused=True)``, ``engine_refused`` to clients).
* Every segment is bounded (``FirstByte``): the first byte within
  ``first_byte_timeout_s``, the whole body within ``segment_timeout_s``,
  and (an engine's ``paced`` calls: the upstream relay) audio at no less
  than ``min_delivery_rate`` after the first byte; an engine may end a body
  that breaks its own bound (``BoundExceeded``: the relay's audio cap).  A
  broken bound fails the attempt like any other failure, so its response
  is closed and its replica's slot given back.
* No replica could take it now (every attempt met a full replica, 429/503,
  or a refused connection, or none was routable): ``SynthesisError`` with
  ``busy``, which clients hear as ``busy`` with retry advice.
* Once part of it arrived, any failure fails the segment with
  ``PartialAudioError``: the listener may have heard part of it, and
  repeating it elsewhere would speak it twice.
* Cancel is task cancellation: the ``CancelledError`` reaches the read in
  progress and closing the response closes its connection (a partly read
  response is never returned to the keep-alive pool), so the server sees
  the disconnect at once and stops generating.  The close is shielded: a
  cancel arriving while it runs must not cut it short.

Errors never carry a replica's URL with credentials, an API key or a
traceback: ``routing.Replica.name`` is the redacted URL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

from gateway.engines.base import SynthesisError
from gateway.engines.pool.replicas import ReplicaClient, read_error
from gateway.engines.pool.routing import Outcome, classify_status
from gateway.engines.pool.settings import PoolSettings

log = logging.getLogger(__name__)


class PartialAudioError(SynthesisError):
    """The server failed after part of the segment reached the engine."""


@dataclass(frozen=True)
class Wording:
    """How an engine names its servers in logs and error messages (the
    messages reach clients: they stay as they were)."""

    #: in logs, and in ``no {log_name} replica is available``: ``upstream``, ``vLLM``
    log_name: str
    #: in messages: ``the upstream``, ``the model server``
    server: str
    #: the start of the message when every attempt failed
    none_could: str
    #: what the first-byte deadline waits for, before and after the first
    #: byte came: (``first token``, ``next token``)
    awaited: tuple[str, str]


@dataclass
class Attempt:
    """How one request to one replica went; an engine's subclass adds what
    it counts (seconds of audio, tokens)."""

    outcome: Outcome = Outcome.OK
    kind: str = ""  #: failure kind for metrics (``connect``, ``timeout``, ``http_503``...)
    message: str = ""
    stopped: bool = False  #: the engine asked to stop (cancel)
    #: how much of the segment reached the engine, in its unit (seconds of
    #: audio, token ids)
    delivered: float = 0.0

    @property
    def started(self) -> bool:
        """Part of the segment reached the engine: no retry elsewhere."""
        return self.delivered > 0

    def progress(self) -> str:
        """How far it got, for ``PartialAudioError`` (``120 ms of this
        segment's audio``)."""
        return "part of this segment"


_A = TypeVar("_A", bound=Attempt)


class BoundExceeded(Exception):
    """An engine's body broke one of the segment's bounds (more audio than
    its text can take): a failed attempt of ``kind``, never retried once
    part of it arrived."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class FirstByte:
    """The deadline of one attempt, on the event loop's clock: first the
    first-byte deadline; once ``arrived``, the segment's deadline
    (``segment_timeout_s`` from the request); with ``paced``, also the
    minimum delivery rate (audio per second of reading, time waiting for
    the listener's room not counted).  ``expiry`` says which one expired."""

    def __init__(self, arrived: Callable[[], None], segment_timeout_s: float) -> None:
        self._arrived = arrived
        self._loop = asyncio.get_running_loop()
        self._segment_deadline = self._loop.time() + segment_timeout_s
        self._deadline: asyncio.Timeout | None = None
        self._first_at = 0.0
        self._waited = 0.0  #: seconds spent waiting for room since the first byte
        self._held_at: float | None = None
        self._floor: tuple[float, float, float] | None = None  #: (delivered, rate, grace)
        self.bound = "first byte"  #: what the deadline in force stands for
        self.seen = False

    def bind(self, deadline: asyncio.Timeout) -> None:
        self._deadline = deadline

    def arrived(self) -> None:
        if not self.seen:
            self.seen = True
            self._first_at = self._loop.time()
            self._set(self._segment_deadline, "segment")
            self._arrived()

    def paced(self, delivered_s: float, min_rate: float, grace_s: float) -> None:
        """``delivered_s`` of audio so far: the deadline is when, with
        nothing more, the rate since the first byte falls below ``min_rate``."""
        self._floor = (delivered_s, min_rate, grace_s)
        self._apply()

    def hold(self) -> None:
        """The engine waits for the listener's room: only the segment
        deadline runs meanwhile."""
        self._held_at = self._loop.time()
        if self.seen:
            self._set(self._segment_deadline, "segment")

    def resume(self) -> None:
        if self._held_at is not None and self.seen:
            self._waited += self._loop.time() - self._held_at
        self._held_at = None
        self._apply()

    def _apply(self) -> None:
        if not self.seen or self._floor is None or self._held_at is not None:
            return
        delivered, rate, grace = self._floor
        floor = self._first_at + self._waited + grace + delivered / rate
        if floor < self._segment_deadline:
            self._set(floor, "rate")
        else:
            self._set(self._segment_deadline, "segment")

    def _set(self, when: float, bound: str) -> None:
        self.bound = bound
        if self._deadline is not None:
            self._deadline.reschedule(when)

    def expiry(self, wording: Wording, settings: PoolSettings) -> tuple[str, str]:
        """(kind, message) of the deadline that expired."""
        if self.bound == "segment":
            return "deadline", (
                f"the segment was not done within segment_timeout_s"
                f" ({settings.segment_timeout_s:g} s)"
            )
        if self.bound == "rate" and self._floor is not None:
            return "slow", (
                f"{wording.server} delivered audio slower than min_delivery_rate"
                f" ({self._floor[1]:g} s of audio a second)"
            )
        return "timeout", f"no {wording.awaited[self.seen]} within the timeout"


class Exchange(Generic[_A]):
    """An engine's part of one attempt: the path it posts to, how it reads
    a 2xx body into ``result``, and what the end of the body means."""

    #: the request's path on the replica (``/v1/audio/speech``)
    path: str = ""
    #: what the engine's body decoder raises on a body it cannot read
    wire_error: type[Exception] = ValueError
    #: what a body should be, for messages (``speech audio``)
    body = "the engine's response"

    def __init__(self, result: _A) -> None:
        self.result = result

    async def read(self, response: httpx.Response, first: FirstByte) -> bool:
        """Read a 2xx body; False: the engine asked to stop (``result.stopped``)."""
        raise NotImplementedError

    def finish(self) -> _A:
        """The result once the body was read to its end."""
        return self.result

    def failed(self, kind: str, message: str) -> _A:
        result = self.result
        result.outcome = Outcome.FAILURE
        result.kind = kind
        result.message = message
        return result


async def failover(
    client: ReplicaClient,
    body: Mapping[str, Any],
    exchange: Callable[[], Exchange[_A]],
    wording: Wording,
    tried: frozenset[int] = frozenset(),
) -> _A:
    """Send one segment's request (``body``) until a replica answers it,
    each attempt read by a new ``exchange()``.  Returns the attempt that
    succeeded or was stopped; raises ``SynthesisError``
    (``PartialAudioError`` once part of it arrived).  ``tried``: replicas
    not to ask."""
    last = f"no {wording.log_name} replica is available"
    capacity = True  #: every attempt met a full or absent replica
    for _ in range(client.settings.max_attempts):
        index = await client.choose(tried)
        if index is None:
            break
        tried |= {index}
        result = await client.attempted(index, _attempt(client, index, body, exchange(), wording))
        if result.outcome is Outcome.OK or result.stopped:
            return result
        name = client.pool.replicas[index].name
        if result.started:
            log.warning("%s %s failed mid-segment: %s", wording.log_name, name, result.message)
            raise PartialAudioError(
                f"{wording.server} failed after {result.progress()}: {result.message}"
            )
        if result.outcome is Outcome.CLIENT_ERROR:
            raise SynthesisError(
                f"{wording.server} refused the segment: {result.message}", refused=True
            )
        log.info("%s %s: %s; trying another replica", wording.log_name, name, result.message)
        last = result.message
        capacity = capacity and (result.outcome is Outcome.FULL or result.kind == "connect")
    if capacity:
        raise SynthesisError(f"{wording.none_could} now: {last}; retry shortly", busy=True)
    raise SynthesisError(f"{wording.none_could}: {last}")


async def _attempt(
    client: ReplicaClient,
    index: int,
    body: Mapping[str, Any],
    exchange: Exchange[_A],
    wording: Wording,
) -> _A:
    """One request to replica ``index``: the body read by ``exchange``,
    every error status and transport error turned into its outcome."""
    url = f"{client.bases[index]}{exchange.path}"
    sent = client.clock()
    result = exchange.result
    first = FirstByte(
        lambda: client.ttfb[index].observe(client.clock() - sent),
        client.settings.segment_timeout_s,
    )
    try:
        async with asyncio.timeout(client.settings.first_byte_timeout_s) as deadline:
            first.bind(deadline)
            request = client.http.build_request(
                "POST", url, json=dict(body), timeout=client.attempt_timeout
            )
            response = await client.http.send(request, stream=True)
            try:
                if not 200 <= response.status_code < 300:
                    result.outcome = classify_status(response.status_code)
                    result.kind = f"http_{response.status_code}"
                    result.message = await read_error(response)
                    return result
                if not await exchange.read(response, first):
                    result.stopped = True
                    return result
            finally:
                # shielded: the session's cancel (a task cancel) often lands
                # while the engine's refusal already returned here, and a
                # close interrupted inside httpcore (shielded only from anyio
                # cancellation) leaves the connection open: the server
                # would generate on
                await asyncio.shield(response.aclose())
    except TimeoutError:
        return exchange.failed(*first.expiry(wording, client.settings))
    except BoundExceeded as exc:
        return exchange.failed(exc.kind, str(exc))
    except httpx.TimeoutException:
        return exchange.failed("timeout", f"{wording.server} stopped sending")
    except httpx.ConnectError:
        return exchange.failed("connect", "the replica refused the connection")
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        return exchange.failed("disconnect", "the replica closed the connection mid-response")
    except httpx.HTTPError as exc:
        return exchange.failed("http", f"HTTP error {type(exc).__name__}")
    except exchange.wire_error as exc:
        return exchange.failed("body", f"the response is not {exchange.body}: {exc}")
    return exchange.finish()
