"""A pool of HTTP replicas: the routing state, the pooled HTTP client and the
per-replica figures, shared by every engine that speaks to a pool of servers.

What this module is for: the part of the upstream engine's client that does
not depend on what is asked of a replica.  ``ReplicaClient`` holds the
``pool.Pool`` state machine, one ``httpx.AsyncClient`` (HTTP/1.1 keep-alive
connections, pooled per replica, ``Authorization`` from ``api_key``), the
time-to-first-byte histograms and the voices each replica listed, and hands
out replicas (``choose``: least outstanding below the cap, waiting up to
``queue_timeout_s`` while every routable one is full; ``_release``).
``probe.Prober`` and ``metrics.PoolCollector`` work on any ``ReplicaClient``.
Subclasses add the requests: ``client.UpstreamClient`` (``/v1/audio/speech``)
and the orpheus engine's ``CompletionsClient`` (``/v1/completions``).

What it must not do: log or label anything with a URL's credentials
(``pool.Replica.name`` is the redacted URL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import httpx

from gateway.engines.pool.routing import Outcome, Pool, PoolPolicy
from gateway.engines.pool.settings import PoolSettings, redact_url


class _Outcome(Protocol):
    @property
    def outcome(self) -> Outcome: ...
    @property
    def kind(self) -> str: ...


_Result = TypeVar("_Result", bound=_Outcome)

#: how much of an error response is read for its message
ERROR_BODY_BYTES = 4096


#: what a replica's own error text may hold that must not reach a client or
#: the log: URLs (with their credentials and query), ``Bearer`` tokens,
#: ``key=value`` secrets, and key-shaped words (``sk-...``, long hex/base64)
_SECRETS = (
    (re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE), "<url>"),
    (re.compile(r"\bbearer\s+\S+", re.IGNORECASE), "Bearer <redacted>"),
    (
        re.compile(
            r"\b(api[_-]?key|key|token|secret|password|passwd|authorization|auth)"
            r"(\s*[=:]\s*)\S+",
            re.IGNORECASE,
        ),
        r"\1\2<redacted>",
    ),
    (re.compile(r"\b(?:sk|pk|rk|hf)[-_][A-Za-z0-9_-]{8,}"), "<redacted>"),
    # a long word of letters *and* digits (a key, a token), not a long word
    (
        re.compile(r"\b(?=[A-Za-z+/_-]*\d)(?=[0-9+/_-]*[A-Za-z])[A-Za-z0-9+/_-]{24,}={0,2}"),
        "<redacted>",
    ),
)


def redact_text(text: str) -> str:
    """A replica's error text with URLs, credentials and keys removed."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def error_message(status: int, body: bytes) -> str:
    """A refusal's message from its status and the start of its body:
    ``HTTP 400: ...`` with OpenAI's and vLLM's ``error.message``, vllm-omni's
    ``error`` string or a top-level ``message``, cut to 300 characters and
    ``redact_text``-ed; just ``HTTP 400`` when the body says nothing
    readable."""
    message = f"HTTP {status}"
    try:
        doc = json.loads(body[:ERROR_BODY_BYTES])
    except (ValueError, UnicodeDecodeError):
        return message
    text: object = None
    if isinstance(doc, dict):
        error = doc.get("error")
        text = (error.get("message") if isinstance(error, dict) else error) or doc.get("message")
    if isinstance(text, str) and text:
        message += f": {redact_text(text[:300])}"
    return message


async def read_error(response: httpx.Response) -> str:
    """``error_message`` of a streamed response, reading at most
    ``ERROR_BODY_BYTES`` of its body (a broken one gives just the status)."""
    data = b""
    with contextlib.suppress(httpx.HTTPError):
        async for piece in response.aiter_bytes():
            data += piece
            if len(data) >= ERROR_BODY_BYTES:
                break
    return error_message(response.status_code, data)


#: time-to-first-byte histogram buckets (seconds)
TTFB_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = TTFB_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * len(TTFB_BUCKETS))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


class ReplicaClient:
    """The pool, its HTTP client and the per-replica figures."""

    def __init__(
        self,
        settings: PoolSettings,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.bases = [url.rstrip("/") for url in settings.urls]
        policy = PoolPolicy(
            failure_threshold=settings.failure_threshold,
            cooldown_s=settings.cooldown_s,
            max_per_replica=settings.max_per_replica,
            probing=bool(settings.health_path or settings.ready_paths),
        )
        self.pool = Pool([redact_url(u) for u in settings.urls], policy)
        self.ttfb = [Histogram() for _ in self.bases]
        #: voices each replica listed (None: unknown), from the readiness probe
        self.replica_voices: list[frozenset[str] | None] = [None] * len(self.bases)
        #: bumped when an upload or deletion changes what a replica holds: a
        #: listing fetched before the change is stale and not recorded
        self.voice_epoch = [0] * len(self.bases)
        # identity: bodies are decoded from the raw bytes as they come
        headers = {"Accept-Encoding": "identity"}
        if settings.api_key:
            headers["Authorization"] = f"Bearer {settings.api_key}"
        timeout = httpx.Timeout(
            connect=settings.connect_timeout_s,
            read=settings.read_timeout_s,
            write=settings.read_timeout_s,
            pool=settings.queue_timeout_s or None,
        )
        #: a segment's request: httpx's read timeout also bounds the wait for
        #: the response head and the body's first piece, which
        #: first_byte_timeout_s bounds, so it is never the shorter of the two
        self.attempt_timeout = httpx.Timeout(
            connect=settings.connect_timeout_s,
            read=max(settings.read_timeout_s, settings.first_byte_timeout_s),
            write=settings.read_timeout_s,
            pool=settings.queue_timeout_s or None,
        )
        self.http = httpx.AsyncClient(
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(
                max_connections=len(self.bases) * (settings.max_per_replica + 2),
                max_keepalive_connections=len(self.bases) * settings.max_per_replica,
                # under uvicorn's 5 s keep-alive (vllm-omni, vLLM and this
                # gateway serve with it), so an idle connection is dropped here first
                keepalive_expiry=4.0,
            ),
            transport=transport,
            follow_redirects=False,
            trust_env=False,
        )
        self._room = asyncio.Condition()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def choose(self, tried: frozenset[int]) -> int | None:
        """A replica for the next attempt, waiting (``queue_timeout_s``) while
        every routable one is at its cap; None if there is none."""
        deadline = self.clock() + self.settings.queue_timeout_s
        async with self._room:
            while True:
                index = self.pool.pick(self.clock(), tried)
                if index is not None:
                    self.pool.acquire(index)
                    return index
                left = deadline - self.clock()
                if not self.pool.waiting_for_room(self.clock(), tried) or left <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._room.wait()

    async def attempted(self, index: int, attempt: Awaitable[_Result]) -> _Result:
        """Await one attempt on replica ``index`` (chosen by ``choose``): its
        slot is given back even when the task is cancelled, and its outcome
        is reported to the pool."""
        try:
            result = await attempt
        finally:
            # shielded: a cancelled task still gives its slot back
            await asyncio.shield(self._release(index))
        self.pool.report(index, result.outcome, self.clock(), result.kind)
        return result

    async def _release(self, index: int) -> None:
        self.pool.release(index)
        async with self._room:
            self._room.notify_all()
