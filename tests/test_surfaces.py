"""The same mistake gets the same answer on both surfaces, WebSocket and HTTP.

One real server (the synthetic engine, which declares neither a style prompt
nor voice cloning) answers each row twice: once as a WebSocket message, once
as ``POST /v1/audio/speech``.  A row names the WebSocket error code and the
HTTP status, code and ``param``; where both paths share the check, the
message must match too.  A mistake in the text is ``invalid_message`` on both;
``invalid_config`` is for configuration fields only.

Then the failures that are not the client's: an engine's refusal of a
sentence is ``engine_refused`` on both surfaces; a bug in the gateway is
``internal`` with a log line and no exception text, on both.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from gateway.audio.containers import ContainerEncoder
from gateway.engines.base import (
    EngineEvent,
    EngineStream,
    SegmentRequest,
    StreamRequest,
    SynthesisError,
    SynthesisJob,
)
from gateway.engines.synthetic import SyntheticEngine
from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as make_settings
from tests.helpers import open_ws, send

MAX_CHARS = 300
REFUSE = "QREFUSEQ"  #: a segment with this is refused by the engine
BUG = "QBUGQ"  #: a segment with this breaks as a bug would
SECRET = "secret-internal-detail-7f3a"  #: what a bug's exception says


@dataclass(frozen=True)
class Row:
    name: str
    #: the WebSocket message with the mistake (after ``session.created``)
    ws: dict[str, Any]
    #: the HTTP body's fields that differ from a good request
    http: dict[str, Any]
    ws_code: str
    status: int
    code: str
    param: str | None
    #: a phrase both surfaces' messages hold; None: each words it its own way
    same_words: str | None = None


ROWS = [
    Row(
        "NUL in the text",
        {"type": "input.text", "text": "Hello\x00 there."},
        {"input": "Hello\x00 there."},
        "invalid_message",
        400,
        "invalid_message",
        "input",
        "contains a NUL character (U+0000); remove it",
    ),
    Row(
        "text not a string",
        {"type": "input.text", "text": 5},
        {"input": 5},
        "invalid_message",
        400,
        "invalid_message",
        "input",
        "Expected `str`, got `int`",
    ),
    Row(
        "text too long",
        {"type": "input.text", "text": "word " * (MAX_CHARS // 5 + 1)},
        {"input": "word " * (MAX_CHARS // 5 + 1)},
        "text_too_long",
        400,
        "text_too_long",
        "input",
        f"{MAX_CHARS} characters",
    ),
    Row(
        "unknown voice",
        {"type": "session.config", "voice": "nobody"},
        {"voice": "nobody"},
        "unknown_voice",
        400,
        "unknown_voice",
        "voice",
        "unknown voice 'nobody'; available voices:",
    ),
    Row(
        "speed out of range",
        {"type": "session.config", "speed": 9},
        {"speed": 9},
        "invalid_config",
        400,
        "invalid_config",
        "speed",
        "Expected `float` <= 4.0 - at `$.speed`",
    ),
    Row(
        "speed not a number",
        {"type": "session.config", "speed": "fast"},
        {"speed": "fast"},
        "invalid_config",
        400,
        "invalid_config",
        "speed",
        "got `str` - at `$.speed`",
    ),
    Row(
        "sample rate out of range",
        {"type": "session.config", "sample_rate": 1000},
        {"sample_rate": 1000, "response_format": "pcm"},
        "invalid_config",
        400,
        "invalid_config",
        "sample_rate",
        "Expected `int` >= 8000 - at `$.sample_rate`",
    ),
    Row(
        "unknown model",
        {"type": "session.config", "model": "tts-9"},
        {"model": "tts-9"},
        "invalid_config",
        400,
        "invalid_config",
        "model",
        "unknown model 'tts-9'; this server runs 'synthetic'",
    ),
    Row(
        "instructions the engine cannot follow",
        {"type": "session.config", "instructions": "Whisper it."},
        {"instructions": "Whisper it."},
        "unsupported_option",
        400,
        "unsupported_option",
        "instructions",
        "`instructions` cannot be honoured by the 'synthetic' engine",
    ),
    Row(
        "a language the voice does not speak",
        {"type": "session.config", "language": "de"},
        {"language": "de"},
        "unsupported_option",
        400,
        "unsupported_option",
        "language",
        "language: voice 'tone' speaks en-US (English), not 'de'",
    ),
    Row(
        "a clone field for an engine that cannot clone",
        {"type": "session.config", "ref_text": "Hi."},
        {"ref_text": "Hi."},
        "unsupported_option",
        400,
        "unsupported_option",
        "ref_text",
        "`ref_text` = 'Hi.' is not supported by this engine",
    ),
]


class _FaultyJob(SynthesisJob):
    """A segment that fails before any audio: refused, or as a bug would."""

    def __init__(self, inner: SynthesisJob, exc: Exception) -> None:
        self.inner = inner
        self.stats = inner.stats
        self.exc = exc

    async def _events(self) -> AsyncIterator[EngineEvent]:
        self.inner.cancel()
        raise self.exc
        yield  # an async generator

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._events()

    def cancel(self) -> None:
        self.inner.cancel()


class _FaultyStream(EngineStream):
    def __init__(self, inner: EngineStream) -> None:
        self.inner = inner
        self.request = inner.request

    def submit(self, segment: SegmentRequest) -> SynthesisJob:
        job = self.inner.submit(segment)
        if REFUSE in segment.text:
            return _FaultyJob(job, SynthesisError("the model cannot read this text", refused=True))
        if BUG in segment.text:
            return _FaultyJob(job, RuntimeError(SECRET))
        return job

    def cancel(self) -> None:
        self.inner.cancel()

    def close(self) -> None:
        self.inner.close()


class _FaultyEngine(SyntheticEngine):
    def open_stream(self, request: StreamRequest) -> EngineStream:
        return _FaultyStream(super().open_stream(request))


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    settings = make_settings(engine="synthetic", max_utterance_chars=MAX_CHARS)
    with run_server(settings, _FaultyEngine(settings)) as running:
        yield running


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def tracebacks(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.exc_info]


@pytest.fixture
def server_log() -> Iterator[_Lines]:
    handler = _Lines()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


async def _post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as client:
        return await client.post(server.http + path, json=body)


async def _http(server: RunningServer, **fields: Any) -> httpx.Response:
    body = {"input": "Hello there.", "voice": "tone", "response_format": "wav", **fields}
    return await _post(server, "/v1/audio/speech", body)


async def _ws_events(server: RunningServer, *messages: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON events the server sends after ``messages`` until
    ``session.done`` or the close (binary frames left out)."""
    ws = await open_ws(server.ws_url)
    events: list[dict[str, Any]] = []
    one = len(messages) == 1  # a single mistake: its error ends the exchange
    try:
        assert json.loads(await ws.recv())["type"] == "session.created"
        for message in messages:
            await send(ws, **message)
        while True:
            raw = await ws.recv()
            if isinstance(raw, str):
                events.append(event := json.loads(raw))
                if event["type"] == "session.done" or (event["type"] == "error" and one):
                    break
    except ConnectionClosed:
        pass
    finally:
        await ws.close()
    return events


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
async def test_the_same_mistake_gets_the_same_answer(server: RunningServer, row: Row) -> None:
    events = await _ws_events(server, row.ws)
    errors = [e for e in events if e["type"] == "error"]
    assert errors, events
    ws_error = errors[0]
    assert ws_error["code"] == row.ws_code, ws_error
    response = await _http(server, **row.http)
    assert response.status_code == row.status, response.text
    http_error = response.json()["error"]
    assert http_error["code"] == row.code, http_error
    assert http_error["param"] == row.param, http_error
    if row.same_words is not None:
        assert row.same_words in ws_error["message"], ws_error
        assert row.same_words in http_error["message"], http_error
    for message in (ws_error["message"], http_error["message"]):
        assert "Traceback" not in message and "gateway/" not in message


async def test_an_engine_refusal_is_engine_refused_on_both(server: RunningServer) -> None:
    events = await _ws_events(
        server,
        {"type": "input.text", "text": f"Say {REFUSE} now."},
        {"type": "input.done"},
    )
    [error] = [e for e in events if e["type"] == "error"]
    assert error["code"] == "engine_refused" and error["fatal"] is False
    assert "the model cannot read this text" in error["message"]
    [done] = [e for e in events if e["type"] == "audio.done"]
    assert done["error"] is True
    response = await _http(server, input=f"Say {REFUSE} now.")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "engine_refused"
    assert "the model cannot read this text" in response.json()["error"]["message"]


async def test_a_gateway_bug_is_internal_logged_and_not_shown(
    server: RunningServer, server_log: _Lines
) -> None:
    """On every way out (WebSocket, HTTP file and stream, SSE, batch): the
    code ``internal``, a traceback in the log, no exception text sent."""
    events = await _ws_events(
        server, {"type": "input.text", "text": f"Say {BUG} now."}, {"type": "input.done"}
    )
    [error] = [e for e in events if e["type"] == "error"]
    assert error["code"] == "internal" and error["fatal"] is False, error
    assert [e["error"] for e in events if e["type"] == "audio.done"] == [True]
    sent = [json.dumps(events)]

    for fields in ({}, {"stream": False}):
        response = await _http(server, input=f"Say {BUG} now.", **fields)
        assert response.status_code == 500, response.text
        assert response.json()["error"]["code"] == "internal"
        sent.append(response.text)
    sse = await _http(server, input=f"Say {BUG} now.", stream_format="sse")
    assert sse.status_code == 200
    [event] = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data:")]
    assert event["type"] == "speech.audio.error" and event["error"]["code"] == "internal"
    assert "event: speech.audio.error\n" in sse.text  # vllm-omni 0.30's event line
    sent.append(sse.text)
    batch = await _post(
        server,
        "/v1/audio/speech/batch/gateway",
        {"voice": "tone", "items": [{"input": f"Say {BUG} now."}, {"input": "Fine."}]},
    )
    broken, fine = batch.json()["data"]
    assert broken["error"]["code"] == "internal" and fine["status"] == "ok"
    assert base64.b64decode(fine["audio"])
    sent.append(batch.text)
    omni = await _post(  # the same batch in vllm-omni 0.30's answer
        server,
        "/v1/audio/speech/batch",
        {"voice": "tone", "items": [{"input": f"Say {BUG} now."}, {"input": "Fine."}]},
    )
    broken, fine = omni.json()["results"]
    assert broken["status"] == "error" and broken["code"] == "internal"
    assert fine["status"] == "success" and base64.b64decode(fine["audio_data"])
    sent.append(omni.text)

    for text in sent:
        assert SECRET not in text and "RuntimeError" not in text
    # one traceback per failure: the WebSocket, two HTTP, SSE and two batches
    assert len(server_log.tracebacks()) >= 6, server_log.records


async def test_a_bug_in_the_encoder_is_internal_and_not_shown(
    server: RunningServer, server_log: _Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug past the pipeline (the container encoder): a JSON 500
    ``internal`` before any audio, an SSE ``error`` event, a batch item's
    error; the traceback in the log, never in the answer."""

    def broken(self: ContainerEncoder, samples: Any) -> bytes:
        raise RuntimeError(SECRET)

    monkeypatch.setattr(ContainerEncoder, "push", broken)
    response = await _http(server, response_format="mp3")
    assert response.status_code == 500 and response.json()["error"]["code"] == "internal"
    sse = await _http(server, response_format="mp3", stream_format="sse")
    assert '"code":"internal"' in sse.text
    batch = await _post(
        server,
        "/v1/audio/speech/batch/gateway",
        {"voice": "tone", "items": [{"input": "Hi there."}]},
    )
    assert batch.json()["data"][0]["error"]["code"] == "internal"
    for text in (response.text, sse.text, batch.text):
        assert SECRET not in text and "RuntimeError" not in text
    assert len(server_log.tracebacks()) >= 3
    assert server.state.http_admission.active == 0
