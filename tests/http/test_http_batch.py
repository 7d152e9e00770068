"""POST /v1/audio/speech/batch/gateway (the gateway's own answer): shared
defaults, per-item overrides, mixed results.  The same batch in vllm-omni
0.30's answer (``/v1/audio/speech/batch``) is tests/http/test_http_vllm_omni.py."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.engines.base import Capabilities, EngineStream, StreamRequest
from gateway.engines.synthetic import SyntheticEngine
from gateway.http.batch import ignored_keys
from gateway.settings import Settings
from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as make_settings
from tests.http.helpers import decode


def test_batch_mixed_items(piper_server: RunningServer) -> None:
    body = {
        "model": "tts-1",
        "voice": "alloy",
        "response_format": "wav",
        "items": [
            {"input": "First item."},
            {
                "input": "Second item, as pcm at 16 kHz.",
                "response_format": "pcm",
                "sample_rate": 16000,
            },
            {"input": "Bad voice.", "voice": "nobody"},
            {"input": ""},
            {"input": "Third item, in mp3.", "response_format": "mp3", "voice": {"id": "echo"}},
            {"input": "Streaming is refused in a batch.", "stream": True},
            "not an object",
            {"input": "Uses the alias table.", "instructions": "loudly"},
        ],
    }
    response = httpx.post(
        piper_server.http + "/v1/audio/speech/batch/gateway", json=body, timeout=120
    )
    assert response.status_code == 200, response.text
    doc = response.json()
    results = doc["data"]
    assert [r["index"] for r in results] == list(range(8))
    status = [r["status"] for r in results]
    assert status == ["ok", "ok", "error", "error", "ok", "error", "error", "error"]
    assert doc["succeeded"] == 3 and doc["failed"] == 5
    wav = results[0]
    assert wav["media_type"] == "audio/wav"
    audio, rate = decode(base64.b64decode(wav["audio"]), "wav")
    assert rate == 24000 and abs(len(audio) * 1000 / rate - wav["audio_ms"]) < 1
    pcm = results[1]
    assert pcm["sample_rate"] == 16000 and pcm["media_type"] == "audio/pcm"
    assert results[4]["media_type"] == "audio/mpeg"
    decode(base64.b64decode(results[4]["audio"]), "mp3")
    assert results[2]["error"]["code"] == "unknown_voice"
    assert results[3]["error"]["code"] == "invalid_message"
    assert results[3]["error"]["param"] == "input"
    assert results[5]["error"]["param"] == "stream"
    assert results[6]["error"]["code"] == "invalid_message"
    assert results[7]["error"]["code"] == "unsupported_option"


def test_batch_limits(server_factory: Callable[..., RunningServer]) -> None:
    """Both batch routes refuse a whole batch alike."""
    server = server_factory(max_batch_items=2, max_batch_chars=30)
    for route in ("/v1/audio/speech/batch", "/v1/audio/speech/batch/gateway"):
        _check_limits(server.http + route)


def _check_limits(url: str) -> None:
    many = {"voice": "joe", "items": [{"input": "a"}] * 3}
    response = httpx.post(url, json=many, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "items"
    long = {"voice": "joe", "items": [{"input": "x" * 20}, {"input": "y" * 20}]}
    response = httpx.post(url, json=long, timeout=30)
    assert response.json()["error"]["code"] == "text_too_long"
    response = httpx.post(url, content=b"{nope", timeout=30)
    assert response.json()["error"]["code"] == "invalid_json"
    response = httpx.post(url, json={"voice": "joe"}, timeout=30)
    assert response.json()["error"]["code"] == "invalid_message"


class _RecordingEngine(SyntheticEngine):
    """The synthetic engine, declaring a style prompt and voice cloning, that
    keeps every ``StreamRequest`` it is given (what reached the engine)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.requests: list[StreamRequest] = []

    @property
    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities, instructions=True, cloning=True)

    def open_stream(self, request: StreamRequest) -> EngineStream:
        self.requests.append(request)
        return super().open_stream(request)


def test_batch_keeps_instructions_language_and_clone_fields() -> None:
    """A batch item reaches the engine with everything a single request
    would pass: the style prompt, the language and the voice-clone options."""
    settings = make_settings(engine="synthetic")
    engine = _RecordingEngine(settings)
    clone = {"task_type": "Base", "ref_audio": "data:audio/wav;base64,UklGRg==", "ref_text": "Hi."}
    item = {"input": "Hello there.", "instructions": " Whisper it. ", "language": "en", **clone}
    with run_server(settings, engine) as server:
        single = httpx.post(
            server.http + "/v1/audio/speech",
            json={"voice": "tone", "response_format": "wav", **item},
            timeout=60,
        )
        assert single.status_code == 200, single.text
        batch = httpx.post(
            server.http + "/v1/audio/speech/batch/gateway",
            json={"voice": "tone", "response_format": "wav", "items": [item]},
            timeout=60,
        )
    assert batch.status_code == 200, batch.text
    assert batch.json()["data"][0]["status"] == "ok", batch.text
    assert len(engine.requests) == 2
    direct, batched = engine.requests
    assert batched.instructions == direct.instructions == "Whisper it."
    assert batched.language == direct.language == "en-US"
    assert dict(batched.options) == dict(direct.options) == clone


@pytest.mark.parametrize(
    ("defaults", "items", "paths", "per_item"),
    [
        ({"voice": "joe"}, [{"input": "a"}], [], [[]]),
        (  # a shared default's name; an item's by its path; its request carries both
            {"temperature": 1},
            [{"input": "a"}, {"input": "b", "top_p": None}],
            ["temperature", "items[1].top_p"],
            [["temperature"], ["temperature", "top_p"]],
        ),
        (  # an item repeating a shared unknown key: named by both paths, once per item
            {"temperature": 1},
            [{"input": "a", "temperature": 2}],
            ["temperature", "items[0].temperature"],
            [["temperature"]],
        ),
        (  # an item that is not an object is never spoken: it carries nothing
            {"seedz": 1},
            ["text", {"input": "b", "references": None}],
            ["seedz"],
            [[], ["seedz"]],
        ),
    ],
)
def test_ignored_keys(
    defaults: dict[str, Any], items: list[Any], paths: list[str], per_item: list[list[str]]
) -> None:
    assert ignored_keys(items, defaults) == (paths, per_item)
