"""The HTTP answers a vllm-omni 0.30 client reads, against a real server:
what ``stream`` and a body without it mean, the default format under each
``http_compat``, SSE in 0.30's form, the batch in 0.30's shape, the voice
API's answers and status codes, ``GET /v1/models``.  The requests and
answers are taken from 0.30's ``protocol/audio.py``, ``serving_speech.py``
and ``api_server.py``; 0.30's own benchmark client runs against the gateway
in tests_vllm_omni/."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf

from gateway.http.compat import response_mode
from tests.conftest import RunningServer
from tests.http.helpers import decode

TEXT = "The quick brown fox jumps over the lazy dog."


def speech(server: RunningServer, **body: Any) -> httpx.Response:
    return httpx.post(
        server.http + "/v1/audio/speech", json={"voice": "joe", "input": TEXT, **body}, timeout=60
    )


def sse_events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event line's name, data) of each event, 0.30's ``event:`` + ``data:``."""
    out = []
    for block in response.text.split("\n\n"):
        if not block:
            continue
        event_line, data_line = block.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: "), block
        out.append((event_line[7:], json.loads(data_line[6:])))
    return out


# --- what a body means (gateway/http/compat.py) -------------------------------------------


@pytest.mark.parametrize(
    ("stream", "stream_format", "fmt", "openai", "omni"),
    [
        (None, None, "wav", "audio", "file"),
        (None, None, "flac", "file", "file"),
        (True, None, "wav", "sse", "sse"),
        (False, None, "wav", "file", "file"),
        (None, "audio", "pcm", "audio", "audio"),
        (None, "sse", "pcm", "sse", "sse"),
        (True, "audio", "pcm", "audio", "audio"),
        (False, "sse", "pcm", "sse", "sse"),  # 0.30: stream_format wins
        (False, "audio", "pcm", "audio", "audio"),
        (None, "chunks", "pcm", None, None),
    ],
)
def test_response_mode_table(
    stream: bool | None, stream_format: str | None, fmt: str, openai: str | None, omni: str | None
) -> None:
    assert response_mode(stream, stream_format, fmt, "openai") == openai
    assert response_mode(stream, stream_format, fmt, "vllm-omni") == omni


def test_stream_true_is_sse_in_vllm_omni_form(piper_server: RunningServer) -> None:
    """0.30: ``stream: true`` without ``stream_format`` is SSE: an ``event:``
    line per event, deltas with ``audio`` and ``response_format``, and the
    usage (with ``input_token_details``) in ``speech.audio.done``."""
    response = speech(piper_server, stream=True, response_format="pcm")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert all(name == data["type"] for name, data in events)
    *deltas, (_, done) = events
    assert deltas and {d["type"] for _, d in deltas} == {"speech.audio.delta"}
    assert {d["response_format"] for _, d in deltas} == {"pcm"}
    pcm = b"".join(base64.b64decode(d["audio"]) for _, d in deltas)
    assert done["type"] == "speech.audio.done"
    assert abs(len(pcm) / 2 / 24 - done["audio_ms"]) < 1
    usage = done["usage"]
    assert usage["input_tokens"] == len(TEXT) == usage["input_token_details"]["text_tokens"]
    assert usage["output_tokens"] == done["audio_ms"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["input_token_details"]["audio_tokens"] == 0


def test_stream_false_with_stream_format_sse_is_sse(piper_server: RunningServer) -> None:
    """0.30 reads ``stream_format`` first: ``stream: false`` does not
    contradict it (the gateway refused the pair before)."""
    response = speech(piper_server, stream=False, stream_format="sse", response_format="pcm")
    assert response.status_code == 200, response.text
    assert sse_events(response)[-1][0] == "speech.audio.done"


def test_openai_camp_defaults(piper_server: RunningServer) -> None:
    """``http_compat = "openai"`` (the default): no format is MP3, and a body
    without ``stream`` or ``stream_format`` is streamed (no Content-Length)."""
    response = speech(piper_server)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/mpeg"
    assert "content-length" not in response.headers
    assert len(decode(response.content, "mp3")[0]) > 24_000


def test_vllm_omni_camp_defaults(server_factory: Callable[..., RunningServer]) -> None:
    """``http_compat = "vllm-omni"``: 0.30's defaults, ``wav`` and one whole
    file whose header has the exact sizes (0.30's non-streaming answer)."""
    server = server_factory(http_compat="vllm-omni")
    response = speech(server)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/wav"
    data = response.content
    assert response.headers["content-length"] == str(len(data))
    assert int.from_bytes(data[4:8], "little") == len(data) - 8  # RIFF size, not 0xFFFFFFFF
    audio, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == 24_000 and len(audio) > rate
    # 0.30's usage headers of a whole file: characters and milliseconds here
    audio_ms = round(len(audio) * 1000 / rate)
    usage = {k: int(v) for k, v in response.headers.items() if k.startswith("x-vllm-omni-")}
    assert usage == {
        "x-vllm-omni-input-tokens": len(TEXT),
        "x-vllm-omni-output-tokens": audio_ms,
        "x-vllm-omni-total-tokens": len(TEXT) + audio_ms,
        "x-vllm-omni-input-text-tokens": len(TEXT),
        "x-vllm-omni-input-audio-tokens": 0,
    }
    # what a body says is the same under both camps
    streamed = speech(server, stream_format="audio", response_format="pcm")
    assert "content-length" not in streamed.headers and len(streamed.content) > 48_000
    assert sse_events(speech(server, stream=True, response_format="wav"))[-1][0] == (
        "speech.audio.done"
    )


def test_sse_error_is_speech_audio_error(piper_server: RunningServer) -> None:
    """A mistake found before audio is still a JSON 400; the SSE error event
    itself is covered where an engine fails (tests/test_surfaces.py)."""
    response = speech(piper_server, stream=True, voice="nobody")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unknown_voice"


# --- batch ---------------------------------------------------------------------------------


def test_batch_in_vllm_omni_shape(piper_server: RunningServer) -> None:
    """0.30's ``BatchSpeechRequest``: batch-level defaults each item
    overrides (an item's null keeps the default), ``wav`` by default; its
    ``BatchSpeechResponse``: ``{id, results, total, succeeded, failed}``,
    each result ``{index, status, audio_data, media_type, usage}`` or
    ``{index, status: "error", error: "<message>"}``."""
    body = {
        "model": "tts-1",
        "voice": "joe",
        "speed": 1.0,
        "items": [
            {"input": "The same words twice."},
            {"input": "Second item, as pcm.", "response_format": "pcm", "voice": None},
            {"input": "Bad voice.", "voice": "nobody"},
            {"input": "The same words twice.", "speed": 2.0},
        ],
    }
    response = httpx.post(piper_server.http + "/v1/audio/speech/batch", json=body, timeout=120)
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["id"].startswith("speech-batch-")
    assert (doc["total"], doc["succeeded"], doc["failed"]) == (4, 3, 1)
    results = doc["results"]
    assert [r["index"] for r in results] == [0, 1, 2, 3]
    assert [r["status"] for r in results] == ["success", "success", "error", "success"]
    first, second, bad, fast = results
    assert first["media_type"] == "audio/wav"  # 0.30's batch default
    audio, rate = decode(base64.b64decode(first["audio_data"]), "wav")
    assert rate == 24_000 and abs(len(audio) * 1000 / rate - first["usage"]["output_tokens"]) < 1
    assert first["usage"]["input_tokens"] == len("The same words twice.")
    assert second["media_type"] == "audio/pcm" and second["voice"] == "joe"
    assert "audio_data" not in bad and "usage" not in bad
    assert isinstance(bad["error"], str) and "nobody" in bad["error"]
    assert bad["code"] == "unknown_voice"
    # the item's speed overrode the batch's
    assert fast["usage"]["output_tokens"] < 0.7 * first["usage"]["output_tokens"]
    # nothing unknown, nothing named
    assert "x-ignored-fields" not in response.headers
    assert all("ignored_fields" not in r for r in results)


@pytest.mark.parametrize("route", ["/v1/audio/speech/batch", "/v1/audio/speech/batch/gateway"])
def test_batch_names_its_unknown_fields(piper_server: RunningServer, route: str) -> None:
    """A batch's unknown keys are ignored and named, as a single request's
    are: every path in ``X-Ignored-Fields`` (a shared default by its name,
    an item's as ``items[i].name``), and each result's ``ignored_fields``
    lists the keys ignored when speaking it (the shared defaults' and its
    own, a null one included).  They change nothing else."""
    body = {
        "voice": "joe",
        "temperature": 0.7,
        "items": [
            {"input": "One."},
            {"input": "Two.", "top_p": 0.9, "temperature": 0.2},
            {"input": "Three.", "voice": "nobody", "top_k": None},
            "not an object",
        ],
    }
    response = httpx.post(piper_server.http + route, json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert response.headers["x-ignored-fields"] == (
        '"temperature", "items[1].top_p", "items[1].temperature", "items[2].top_k"'
    )
    doc = response.json()
    results = doc.get("results", doc.get("data"))
    assert [r.get("ignored_fields") for r in results] == [
        ["temperature"],
        ["temperature", "top_p"],
        ["temperature", "top_k"],
        None,
    ]
    assert [r["status"] != "error" for r in results] == [True, True, False, False]
    assert (doc["succeeded"], doc["failed"]) == (2, 2)


def test_batch_over_32_items_is_refused(piper_server: RunningServer) -> None:
    """0.30's cap (``tts_batch_max_items``, 32) is ``max_batch_items``'s default."""
    items = [{"input": "Hi."}] * 33
    response = httpx.post(
        piper_server.http + "/v1/audio/speech/batch",
        json={"voice": "joe", "items": items},
        timeout=30,
    )
    assert response.status_code == 400
    assert "at most 32" in response.json()["error"]["message"]


# --- voices --------------------------------------------------------------------------------


def _tone(seconds: float) -> bytes:
    t = np.arange(int(seconds * 16000)) / 16000
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000, format="WAV")
    return buf.getvalue()


def _upload(server: RunningServer, name: str, **fields: str) -> httpx.Response:
    """0.30's form: ``audio_sample``, ``consent``, ``name``, ``ref_text``,
    ``speaker_description``."""
    return httpx.post(
        server.http + "/v1/audio/voices",
        data={"name": name, "consent": "rec-0001", **fields},
        files={"audio_sample": ("ref.wav", _tone(3.0), "audio/wav")},
        timeout=60,
    )


def test_voice_api_in_vllm_omni_shapes(
    server_factory: Callable[..., RunningServer], tmp_path: Any
) -> None:
    server = server_factory(data_dir=str(tmp_path))
    added = _upload(server, "Narrator", ref_text="Hello there.", speaker_description="warm")
    assert added.status_code == 200, added.text  # 0.30: 200, not 201
    doc = added.json()
    assert doc["success"] is True
    voice = doc["voice"]
    assert voice["name"] == "Narrator" and voice["consent"] == "rec-0001"
    assert voice["mime_type"] == "audio/wav" and voice["file_size"] == len(_tone(3.0))
    assert voice["ref_text"] == "Hello there." and voice["speaker_description"] == "warm"
    assert isinstance(voice["created_at"], (int, float))

    listed = httpx.get(server.http + "/v1/audio/voices", timeout=30).json()
    assert "joe" in listed["voices"]
    [entry] = listed["uploaded_voices"]
    for key in ("name", "consent", "created_at", "file_size", "mime_type", "embedding_source"):
        assert entry[key] == voice[key] if key in voice else key in entry
    assert entry["embedding_source"] == "audio" and entry["embedding_dim"] is None

    deleted = httpx.delete(server.http + "/v1/audio/voices/narrator", timeout=30)
    assert deleted.status_code == 200
    assert deleted.json()["success"] is True
    assert deleted.json()["message"] == "Voice 'Narrator' deleted successfully"
    missing = httpx.delete(server.http + "/v1/audio/voices/narrator", timeout=30)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert httpx.get(server.http + "/v1/audio/voices", timeout=30).json()["uploaded_voices"] == []


def test_speaker_embedding_upload_is_refused_by_name(
    server_factory: Callable[..., RunningServer], tmp_path: Any
) -> None:
    """0.30's other upload, a JSON embedding: the gateway keeps audio only."""
    server = server_factory(data_dir=str(tmp_path))
    response = httpx.post(
        server.http + "/v1/audio/voices",
        data={"name": "Vec", "consent": "yes", "speaker_embedding": json.dumps([0.1] * 8)},
        files={"unused": ("x.txt", b"x", "text/plain")},
        timeout=30,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unsupported_option" and error["param"] == "speaker_embedding"


# --- models --------------------------------------------------------------------------------


def test_models_list_the_accepted_model_ids(piper_server: RunningServer) -> None:
    """vLLM's ``ModelList`` (0.30's ``/v1/models``); its benchmark takes
    ``data[0].id`` as the model: the engine's name, then every id a speech
    request may send, each of which speaks."""
    doc = httpx.get(piper_server.http + "/v1/models", timeout=30).json()
    assert doc["object"] == "list"
    ids = [m["id"] for m in doc["data"]]
    assert ids[0] == "piper" and {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(ids)
    for card in doc["data"]:
        assert card["object"] == "model" and isinstance(card["created"], int)
        assert {"owned_by", "root", "parent", "max_model_len", "permission"} <= set(card)
    for model in ids:
        response = speech(piper_server, model=model, input="Hi.", stream=False)
        assert response.status_code == 200, (model, response.text)
