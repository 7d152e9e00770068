"""The gateway's answers read with vllm-omni 0.30's own pydantic models
(``protocol/audio.py`` from the wheel): the batch answer is a
``BatchSpeechResponse``, SSE usage a ``SpeechTokenUsage``; and what 0.30's
``OpenAICreateSpeechRequest`` makes of a client's fields gets the answer
0.30 gives it."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx

from tests.helpers import ServeProcess
from tests_vllm_omni.conftest import omni_client


def _post(gateway: ServeProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(gateway.http + path, json=body, timeout=120)


def test_batch_answer_is_a_batch_speech_response(gateway: ServeProcess) -> None:
    body = {
        "voice": "joe",
        "items": [
            {"input": "One item."},
            # a key 0.30 does not know: named in the gateway's `ignored_fields`,
            # a key 0.30's own result model ignores
            {"input": "Another, as pcm.", "response_format": "pcm", "temperature": 0.7},
            {"input": "A voice nobody has.", "voice": "nobody"},
        ],
    }
    response = _post(gateway, "/v1/audio/speech/batch", body)
    assert response.status_code == 200, response.text
    checked = omni_client("validate", "BatchSpeechResponse", stdin=response.json())
    assert checked["ok"], checked
    parsed = checked["dump"]
    assert (parsed["total"], parsed["succeeded"], parsed["failed"]) == (3, 2, 1)
    ok, pcm, bad = parsed["results"]
    assert ok["status"] == "success" and ok["media_type"] == "audio/wav"
    assert base64.b64decode(ok["audio_data"])[:4] == b"RIFF"
    assert ok["usage"]["input_token_details"]["text_tokens"] == len("One item.")
    assert pcm["media_type"] == "audio/pcm"
    assert response.json()["results"][1]["ignored_fields"] == ["temperature"]
    assert response.headers["x-ignored-fields"] == '"items[1].temperature"'
    assert bad["status"] == "error" and "nobody" in bad["error"] and bad["usage"] is None


def test_sse_usage_is_a_speech_token_usage(gateway: ServeProcess) -> None:
    """A body as 0.30's model writes it, ``stream: true`` (0.30: SSE)."""
    fields = {"input": "Hello there.", "speaker": "joe", "stream": True, "response_format": "pcm"}
    body = omni_client("request", stdin=fields)
    expected = {"input": "Hello there.", "voice": "joe", "stream": True, "response_format": "pcm"}
    assert body == expected  # 0.30's alias: `speaker` is written as `voice`
    response = _post(gateway, "/v1/audio/speech", body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
    ]
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    checked = omni_client("validate", "SpeechTokenUsage", stdin=done["usage"])
    assert checked["ok"] and checked["dump"] == done["usage"], checked
