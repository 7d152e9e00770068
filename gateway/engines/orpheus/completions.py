"""vLLM's streamed ``POST /v1/completions``: the request body and a pure
decoder of its server-sent events.

What this module is for: the wire format between the orpheus engine and
vLLM (checked against vLLM 0.32's ``CompletionRequest`` and its streamed
``CompletionStreamResponse``).  The request sends the prompt as token ids
(``prompt``: a list of ints), ``stream: true`` and ``return_token_ids: true``,
so every streamed chunk carries its new token ids in ``choices[0].token_ids``
(the first chunk also ``prompt_token_ids``, ignored here): the engine never
detokenizes audio tokens.  The body stops at ``<end_of_speech>``
(``stop_token_ids``), samples with Orpheus' defaults and bounds the length
with ``max_tokens`` (``prompt.max_tokens``).

The stream is SSE: ``data: {json}`` events separated by a blank line, ended
by ``data: [DONE]``.  ``CompletionStream.push`` takes the body's bytes in any
chunking (an event, a line or a UTF-8 character may be split across HTTP
chunks; ``\\r\\n`` or ``\\n`` line ends; comment lines and other fields are
skipped) and returns events:

* ``Tokens(ids)``: the chunk's new token ids (empty chunks are skipped);
* ``Finished(reason)``: a choice's ``finish_reason`` (``stop``, ``length``,
  ``abort``), with the ids of that same chunk delivered first;
* ``StreamFailure(message)``: an error event (vLLM sends ``{"error": {...}}``
  in the stream when generation fails; older versions
  ``{"object": "error", "message": ...}``);
* ``Done``: ``[DONE]``.

A usage-only chunk (``choices: []``) gives nothing.  A line longer than
``MAX_LINE_BYTES`` or an event that is not JSON raises ``CompletionWireError``.

What it must not do: I/O, or decide what the ids mean (``codes.py`` does).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.engines.orpheus.tokens import END_OF_SPEECH

#: longest SSE line accepted (a chunk of a few token ids is ~300 bytes)
MAX_LINE_BYTES: Final = 1 << 20


class CompletionWireError(ValueError):
    """The body is not vLLM's streamed completion."""


@dataclass(frozen=True)
class Tokens:
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    reason: str


@dataclass(frozen=True)
class StreamFailure:
    message: str


@dataclass(frozen=True)
class Done:
    pass


CompletionEvent = Tokens | Finished | StreamFailure | Done


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.6
    top_p: float = 0.8
    repetition_penalty: float = 1.1
    seed: int | None = None


def completion_body(
    prompt: Sequence[int], max_tokens: int, sampling: Sampling, model: str = ""
) -> dict[str, Any]:
    """The JSON of one segment's streamed completion request."""
    body: dict[str, Any] = {
        "prompt": list(prompt),
        "stream": True,
        "return_token_ids": True,
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "repetition_penalty": sampling.repetition_penalty,
        "stop_token_ids": [END_OF_SPEECH],
    }
    if model:
        body["model"] = model
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return body


def _error_message(doc: dict[str, Any]) -> str | None:
    error = doc.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        return str(message) if message else "error"
    if isinstance(error, str):
        return error
    if doc.get("object") == "error":
        return str(doc.get("message") or "error")
    return None


class CompletionStream:
    """The incremental SSE decoder of one streamed completion."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self.done = False  #: ``[DONE]`` arrived
        self.finish_reason: str | None = None

    def push(self, data: bytes) -> list[CompletionEvent]:
        self._buf += data
        events: list[CompletionEvent] = []
        while True:
            end = self._buf.find(b"\n")
            if end < 0:
                if len(self._buf) > MAX_LINE_BYTES:
                    raise CompletionWireError("an event line is too long")
                return events
            line = self._buf[:end].rstrip(b"\r")
            self._buf = self._buf[end + 1 :]
            self._line(line, events)

    def finish(self) -> list[CompletionEvent]:
        """The body ended: an event not yet closed by a blank line counts."""
        events: list[CompletionEvent] = []
        if self._buf:
            self._line(self._buf.rstrip(b"\r"), events)
            self._buf = b""
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[CompletionEvent]) -> None:
        if not line:
            if self._data:
                payload, self._data = "\n".join(self._data), []
                self._event(payload, events)
            return
        if line.startswith(b":"):
            return  # a comment (keep-alive)
        name, _, value = line.partition(b":")
        if name != b"data":
            return  # event:, id:, retry: mean nothing here
        if value.startswith(b" "):
            value = value[1:]
        try:
            self._data.append(value.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise CompletionWireError("an event is not UTF-8") from exc

    def _event(self, payload: str, events: list[CompletionEvent]) -> None:
        if payload.strip() == "[DONE]":
            self.done = True
            events.append(Done())
            return
        try:
            doc = json.loads(payload)
        except ValueError as exc:
            raise CompletionWireError("an event is not JSON") from exc
        if not isinstance(doc, dict):
            raise CompletionWireError("an event is not a JSON object")
        message = _error_message(doc)
        if message is not None:
            events.append(StreamFailure(message[:300]))
            return
        choices = doc.get("choices")
        if not isinstance(choices, list):
            raise CompletionWireError("an event has no choices")
        for choice in choices:  # one prompt, n = 1: at most one choice
            if not isinstance(choice, dict):
                raise CompletionWireError("a choice is not an object")
            ids = choice.get("token_ids")
            if ids is not None:
                if not isinstance(ids, list) or not all(
                    isinstance(i, int) and not isinstance(i, bool) for i in ids
                ):
                    raise CompletionWireError("token_ids is not a list of ids")
                if ids:
                    events.append(Tokens(tuple(ids)))
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self.finish_reason = reason
                events.append(Finished(reason))
