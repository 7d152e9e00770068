"""Streamed completions from a pool of vLLM replicas, with failover before
the first token.

What this module is for: the I/O of one segment's generation.  The pool
(routing, caps, ejection, probes, metrics) is the upstream engine's
(``gateway.engines.pool.replicas.ReplicaClient`` and its ``pool``,
``probe`` and ``metrics`` modules); this module adds the request: one
streamed ``POST {base}/v1/completions`` (``completions.completion_body``),
its events decoded by ``completions.CompletionStream``, the token ids handed
to a ``TokenSink`` (the engine's decode stream).

Rules (as the upstream engine's, with tokens for audio bytes):

* A segment is retried on another replica only while none of its tokens
  arrived: connection refused/reset, a timeout before the first token, 408
  and 5xx (failures), 429 and 503 (the replica is full: never ejected for
  it), a stream that ended or failed before any token.  Another 4xx is the
  request's own fault: the segment fails at once with vLLM's message.
* After the first token any failure fails the segment with
  ``PartialAudioError``: its audio may have been heard, and generating it
  again elsewhere would speak it twice (and differently).
* Cancel is task cancellation: the read in progress ends and the response's
  connection is closed (never returned to the keep-alive pool), so vLLM sees
  the disconnect and aborts the request.
* The sink's ``push`` may wait (the decoder holds enough frames the listener
  has no room for): the body is not read meanwhile, so TCP holds the stream
  back rather than a buffer here.

Errors never carry a replica's URL with credentials or a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from gateway.engines.base import SynthesisError
from gateway.engines.orpheus.completions import (
    CompletionEvent,
    CompletionStream,
    CompletionWireError,
    Finished,
    StreamFailure,
    Tokens,
)
from gateway.engines.pool.replicas import ReplicaClient, read_error
from gateway.engines.pool.routing import Outcome, classify_status
from gateway.engines.upstream.client import PartialAudioError

log = logging.getLogger(__name__)


class TokenSink(Protocol):
    """Where a generation's token ids go (the engine's decode stream)."""

    async def push(self, ids: tuple[int, ...]) -> bool:
        """Take new token ids (may wait for room); False: stop reading."""


@dataclass
class Generation:
    """How one request to one replica went."""

    outcome: Outcome
    kind: str = ""  #: failure kind for metrics (``connect``, ``timeout``, ``http_503``...)
    message: str = ""
    tokens: int = 0  #: token ids handed to the sink
    stopped: bool = False  #: the sink asked to stop (cancel)
    finish_reason: str = ""  #: vLLM's ``finish_reason`` (``stop``, ``length``...)


class CompletionsClient(ReplicaClient):
    """The vLLM replicas and one segment's streamed generation."""

    async def generate(self, body: Mapping[str, Any], sink: TokenSink) -> Generation:
        """Stream one segment's tokens into ``sink``.  Raises ``SynthesisError``
        (``PartialAudioError`` once tokens were delivered)."""
        tried: frozenset[int] = frozenset()
        last = "no vLLM replica is available"
        for _ in range(self.settings.max_attempts):
            index = await self._choose(tried)
            if index is None:
                break
            tried |= {index}
            result = await self._attempted(index, self._attempt(index, body, sink))
            if result.outcome is Outcome.OK or result.stopped:
                return result
            name = self.pool.replicas[index].name
            if result.tokens > 0:
                log.warning("vLLM %s failed mid-segment: %s", name, result.message)
                raise PartialAudioError(
                    f"the model server failed after {result.tokens} tokens of this"
                    f" segment: {result.message}"
                )
            if result.outcome is Outcome.CLIENT_ERROR:
                raise SynthesisError(
                    f"the model server refused the segment: {result.message}", refused=True
                )
            log.info("vLLM %s: %s; trying another replica", name, result.message)
            last = result.message
        raise SynthesisError(f"no model server could speak the segment: {last}")

    async def _attempt(self, index: int, body: Mapping[str, Any], sink: TokenSink) -> Generation:
        url = f"{self.bases[index]}/v1/completions"
        sent = self.clock()
        stream = CompletionStream()
        result = Generation(Outcome.OK)
        failure: str | None = None
        try:
            async with asyncio.timeout(self.settings.first_byte_timeout_s) as first_token:
                request = self.http.build_request("POST", url, json=dict(body))
                response = await self.http.send(request, stream=True)
                try:
                    if not 200 <= response.status_code < 300:
                        return await _refused(response)
                    async for event in _events(response, stream):
                        if isinstance(event, Tokens):
                            if result.tokens == 0:
                                first_token.reschedule(None)  # tokens flow: no deadline
                                self.ttfb[index].observe(self.clock() - sent)
                            result.tokens += len(event.ids)
                            if not await sink.push(event.ids):
                                result.stopped = True
                                return result
                        elif isinstance(event, Finished):
                            result.finish_reason = event.reason
                        elif isinstance(event, StreamFailure):
                            failure = event.message
                finally:
                    await response.aclose()
        except TimeoutError:
            what = "first token" if result.tokens == 0 else "next token"
            return _failed(result, "timeout", f"no {what} within the timeout")
        except httpx.TimeoutException:
            return _failed(result, "timeout", "the model server stopped sending")
        except httpx.ConnectError:
            return _failed(result, "connect", "the replica refused the connection")
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            return _failed(result, "disconnect", "the replica closed the connection mid-response")
        except httpx.HTTPError as exc:
            return _failed(result, "http", f"HTTP error {type(exc).__name__}")
        except CompletionWireError as exc:
            return _failed(result, "body", f"the response is not a streamed completion: {exc}")
        if failure is not None:
            return _failed(result, "upstream_error", f"the model server reported: {failure}")
        if result.finish_reason == "abort":
            return _failed(result, "aborted", "the model server aborted the generation")
        if not stream.done and not result.finish_reason:
            return _failed(result, "truncated", "the stream ended before the generation did")
        return result


def _failed(result: Generation, kind: str, message: str) -> Generation:
    result.outcome = Outcome.FAILURE
    result.kind = kind
    result.message = message
    return result


async def _events(
    response: httpx.Response, stream: CompletionStream
) -> AsyncIterator[CompletionEvent]:
    """The events of a completion's body as it arrives: up to the end of the
    piece where the stream ended or failed, then what its end releases."""
    failed = False
    async for piece in response.aiter_raw():
        for event in stream.push(piece):
            failed = failed or isinstance(event, StreamFailure)
            yield event
        if failed or stream.done:
            break
    for event in stream.finish():
        yield event


async def _refused(response: httpx.Response) -> Generation:
    """An HTTP error status: its outcome, and vLLM's message."""
    message = await read_error(response)
    outcome = classify_status(response.status_code)
    return Generation(outcome, f"http_{response.status_code}", message)
