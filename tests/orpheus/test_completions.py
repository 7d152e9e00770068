"""vLLM's streamed completion: the request body and the SSE decoder, at every
split of the byte stream (the wire shapes are vLLM 0.32's
``CompletionStreamResponse`` with ``return_token_ids``)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.engines.orpheus.completions import (
    MAX_LINE_BYTES,
    CompletionEvent,
    CompletionStream,
    CompletionWireError,
    Done,
    Finished,
    Sampling,
    StreamFailure,
    Tokens,
    completion_body,
)
from gateway.engines.orpheus.tokens import END_OF_SPEECH


def chunk(ids: list[int], finish: str | None = None, first: bool = False) -> bytes:
    choice: dict[str, object] = {
        "index": 0,
        "text": "".join(f"<custom_token_{i}>" for i in ids),
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": END_OF_SPEECH if finish == "stop" else None,
        "token_ids": ids,
    }
    if first:
        choice["prompt_token_ids"] = [128259, 128000, 83, 128009]
    doc = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "orpheus-tiny",
        "choices": [choice],
    }
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


USAGE = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m",'
    b'"choices":[],"usage":{"prompt_tokens":4,"total_tokens":12,"completion_tokens":8}}\n\n'
)
ERROR = (
    b'data: {"error": {"message": "Internal server error", "type": "InternalServerError",'
    b' "param": null, "code": 500}}\n\n'
)
BODY = (
    chunk([128266], first=True)
    + chunk([132362, 136458])
    + chunk([])  # an empty delta
    + b": keep-alive\n\n"
    + chunk([140554, 144650, 148746, 152842, END_OF_SPEECH], finish="stop")
    + USAGE
    + b"data: [DONE]\n\n"
)
EXPECTED_IDS = [128266, 132362, 136458, 140554, 144650, 148746, 152842, END_OF_SPEECH]


def decode(pieces: list[bytes]) -> list[CompletionEvent]:
    stream = CompletionStream()
    events: list[CompletionEvent] = []
    for piece in pieces:
        events.extend(stream.push(piece))
    events.extend(stream.finish())
    return events


def ids_of(events: list[CompletionEvent]) -> list[int]:
    return [i for e in events if isinstance(e, Tokens) for i in e.ids]


def test_a_whole_body() -> None:
    events = decode([BODY])
    assert ids_of(events) == EXPECTED_IDS
    assert [e for e in events if not isinstance(e, Tokens)] == [Finished("stop"), Done()]


def test_every_split_of_the_body_gives_the_same_events() -> None:
    whole = decode([BODY])
    for i in range(len(BODY) + 1):
        assert decode([BODY[:i], BODY[i:]]) == whole, i


@given(st.lists(st.integers(min_value=0, max_value=len(BODY)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(BODY)]
    pieces = [BODY[a:b] for a, b in itertools.pairwise(points)]
    assert decode(pieces) == decode([BODY])


def test_crlf_line_ends_and_other_fields() -> None:
    body = BODY.replace(b"\n", b"\r\n")
    body = body.replace(b"data: [DONE]", b"event: x\r\nid: 3\r\ndata:[DONE]")
    events = decode([body])
    assert ids_of(events) == EXPECTED_IDS and events[-1] == Done()


def test_a_usage_chunk_gives_nothing() -> None:
    assert decode([USAGE]) == []


@pytest.mark.parametrize(
    "event",
    [
        ERROR,
        b'data: {"object": "error", "message": "Internal server error", "code": 500}\n\n',
        b'data: {"error": "Internal server error"}\n\n',
    ],
)
def test_error_events(event: bytes) -> None:
    events = decode([chunk([128266], first=True), event, b"data: [DONE]\n\n"])
    assert events == [Tokens((128266,)), StreamFailure("Internal server error"), Done()]


def test_an_unclosed_last_event_counts_at_the_end() -> None:
    stream = CompletionStream()
    assert stream.push(chunk([1, 2])[:-2]) == []  # no blank line yet
    assert stream.finish() == [Tokens((1, 2))]
    assert not stream.done


@pytest.mark.parametrize(
    "body",
    [
        b"data: not json\n\n",
        b"data: [1, 2]\n\n",
        b'data: {"id": "x"}\n\n',
        b'data: {"choices": [{"token_ids": ["a"]}]}\n\n',
        b'data: {"choices": [{"token_ids": [true]}]}\n\n',
        b'data: {"choices": ["x"]}\n\n',
        b"data: \xff\xfe\n\n",
    ],
)
def test_bodies_that_are_not_completions_fail(body: bytes) -> None:
    with pytest.raises(CompletionWireError):
        decode([body])


def test_an_endless_line_fails_without_growing() -> None:
    stream = CompletionStream()
    with pytest.raises(CompletionWireError):
        for _ in range(MAX_LINE_BYTES // 65536 + 2):
            stream.push(b"x" * 65536)


def test_the_request_body() -> None:
    body = completion_body([1, 2, 3], 280, Sampling(), model="orpheus")
    assert body == {
        "prompt": [1, 2, 3],
        "stream": True,
        "return_token_ids": True,
        "max_tokens": 280,
        "temperature": 0.6,
        "top_p": 0.8,
        "repetition_penalty": 1.1,
        "stop_token_ids": [END_OF_SPEECH],
        "model": "orpheus",
    }
    seeded = completion_body([1], 7, Sampling(temperature=0.0, seed=5))
    assert seeded["seed"] == 5 and seeded["temperature"] == 0.0 and "model" not in seeded
