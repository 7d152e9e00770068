"""Streamed completions from a pool of vLLM replicas, with failover before
the first token.

What this module is for: what one segment's generation asks of a replica
and what its body means.  The pool (routing, caps, ejection, probes,
metrics) and the loop that tries replicas, with its error ladder and retry
rules, are ``gateway.engines.pool``'s (``replicas``, ``failover``: retried
only while none of the segment's tokens arrived, ``PartialAudioError``
after; 429 and 503 mean the replica is full and never eject it).  This
module adds the request, one streamed ``POST {base}/v1/completions``
(``completions.completion_body``), its events decoded by
``completions.CompletionStream``, the token ids handed to a ``TokenSink``
(the engine's decode stream).

The sink's ``push`` may wait (the decoder holds enough frames the listener
has no room for): the body is not read meanwhile, so TCP holds the stream
back rather than a buffer here.  vLLM's ``finish_reason: abort`` and a
stream that ends before the generation did are failures like a cut body.

Errors never carry a replica's URL with credentials or a traceback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from gateway.engines.orpheus.completions import (
    CompletionEvent,
    CompletionStream,
    CompletionWireError,
    Finished,
    StreamFailure,
    Tokens,
)
from gateway.engines.orpheus.settings import OrpheusSettings
from gateway.engines.pool.failover import Attempt, Exchange, FirstByte, Wording, failover
from gateway.engines.pool.replicas import ReplicaClient


class TokenSink(Protocol):
    """Where a generation's token ids go (the engine's decode stream)."""

    async def push(self, ids: tuple[int, ...]) -> bool:
        """Take new token ids (may wait for room); False: stop reading."""


#: how the messages name the servers (they reach clients: unchanged)
WORDING = Wording(
    log_name="vLLM",
    server="the model server",
    none_could="no model server could speak the segment",
    awaited=("first token", "next token"),
)


@dataclass
class Generation(Attempt):
    """How one request to one replica went; ``delivered`` counts the token
    ids handed to the sink."""

    finish_reason: str = ""  #: vLLM's ``finish_reason`` (``stop``, ``length``...)

    @property
    def tokens(self) -> int:
        return int(self.delivered)

    def progress(self) -> str:
        return f"{self.tokens} tokens of this segment"


class CompletionsClient(ReplicaClient):
    """The vLLM replicas and one segment's streamed generation."""

    settings: OrpheusSettings

    async def generate(self, body: Mapping[str, Any], sink: TokenSink) -> Generation:
        """Stream one segment's tokens into ``sink``.  Raises ``SynthesisError``
        (``PartialAudioError`` once tokens were delivered)."""
        return await failover(self, body, lambda: _Completion(sink), WORDING)


class _Completion(Exchange[Generation]):
    """One attempt's streamed completion: token ids to the sink."""

    path = "/v1/completions"
    wire_error = CompletionWireError
    body = "a streamed completion"

    def __init__(self, sink: TokenSink) -> None:
        super().__init__(Generation())
        self.sink = sink
        self.stream = CompletionStream()
        self.failure: str | None = None

    async def read(self, response: httpx.Response, first: FirstByte) -> bool:
        result = self.result
        async for event in _events(response, self.stream):
            if isinstance(event, Tokens):
                first.arrived()
                result.delivered += len(event.ids)
                if not await self.sink.push(event.ids):
                    return False
            elif isinstance(event, Finished):
                result.finish_reason = event.reason
            elif isinstance(event, StreamFailure):
                self.failure = event.message
        return True

    def finish(self) -> Generation:
        if self.failure is not None:
            return self.failed("upstream_error", f"the model server reported: {self.failure}")
        if self.result.finish_reason == "abort":
            return self.failed("aborted", "the model server aborted the generation")
        if not self.stream.done and not self.result.finish_reason:
            return self.failed("truncated", "the stream ended before the generation did")
        return self.result


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
