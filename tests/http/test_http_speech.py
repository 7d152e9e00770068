"""POST /v1/audio/speech with the official OpenAI client: formats, streaming,
SSE, errors in OpenAI's shape, disconnects."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import io
import json
import os
import socket
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from gateway.audio.containers import RESPONSE_FORMATS, format_support
from tests.conftest import RunningServer
from tests.http.helpers import API_KEY, decode, metric

TEXT = "The quick brown fox jumps over the lazy dog."
LONG = " ".join(
    f"Sentence number {i} is here to make the input long enough to stream in pieces."
    for i in range(12)
)
#: encoder padding and priming (MP3 adds about a frame, Opus pre-skip is removed)
TOLERANCE_MS = 120.0


def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http + "/v1", api_key=API_KEY, max_retries=0)


def engine_audio_ms(server: RunningServer, text: str) -> float:
    """The audio length the server reports for ``text`` (SSE ``audio_ms``)."""
    response = httpx.post(
        server.http + "/v1/audio/speech",
        json={
            "model": "tts-1",
            "voice": "alloy",
            "input": text,
            "response_format": "pcm",
            "stream_format": "sse",
        },
        timeout=60,
    )
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line[:5] == "data:"]
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    return float(done["audio_ms"])


PROMISED = ("mp3", "opus", "flac", "wav", "pcm")


def test_promised_formats_are_present_under_ci() -> None:
    support = format_support()
    missing = [f for f in PROMISED if not support.available[f]]
    if os.environ.get("CI") == "true":
        assert not missing, f"libsndfile {support.libsndfile_version} lacks {missing}"
    elif missing:
        pytest.skip(f"libsndfile {support.libsndfile_version} lacks {missing}")
    assert not support.available["aac"]


@pytest.mark.parametrize("response_format", PROMISED)
def test_sdk_create_each_format(piper_server: RunningServer, response_format: str) -> None:
    if not format_support().available[response_format]:
        pytest.skip(f"{response_format} unavailable in this libsndfile")
    expected_ms = engine_audio_ms(piper_server, TEXT)
    # the SDK's defaults, nothing extra: a streamed body (OpenAI's
    # stream_format "audio"), except FLAC, which comes whole (see below)
    response = client(piper_server).audio.speech.create(
        model="tts-1",
        voice="alloy",
        input=TEXT,
        response_format=response_format,  # type: ignore[arg-type]
    )
    rate = int(response.response.headers["x-sample-rate"])
    assert rate == 24_000
    audio, sr = decode(response.content, response_format, rate)
    assert sr == rate
    assert abs(len(audio) * 1000 / sr - expected_ms) <= TOLERANCE_MS
    assert np.abs(audio).max() > 0.05  # speech, not silence


def _streaminfo_total_samples(data: bytes) -> int:
    assert data[:4] == b"fLaC"
    streaminfo = data[8:42]
    return int.from_bytes(streaminfo[13:18], "big") & ((1 << 36) - 1)


def test_sdk_flac_reads_back_with_libsndfile(piper_server: RunningServer) -> None:
    """``speech.create(response_format="flac")`` with the SDK's defaults reads
    the body whole: it gets a complete FLAC whose STREAMINFO carries the true
    sample count, which libsndfile (through soundfile) reads back."""
    expected_ms = engine_audio_ms(piper_server, TEXT)
    response = client(piper_server).audio.speech.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="flac"
    )
    data = response.content
    assert response.response.headers["content-length"] == str(len(data))
    audio, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == 24_000
    assert _streaminfo_total_samples(data) == len(audio)
    assert abs(len(audio) * 1000 / rate - expected_ms) <= TOLERANCE_MS
    assert np.abs(audio).max() > 0.05


def test_streamed_flac_has_unknown_length_header(piper_server: RunningServer) -> None:
    data = (
        client(piper_server)
        .audio.speech.create(
            model="tts-1",
            voice="alloy",
            input=TEXT,
            response_format="flac",
            extra_body={"stream_format": "audio"},
        )
        .content
    )
    assert _streaminfo_total_samples(data) == 0  # "unknown" in the FLAC specification
    assert len(data) > 1000


def test_pcm_is_24k_unless_sample_rate(piper_server: RunningServer) -> None:
    sdk = client(piper_server)
    response = sdk.audio.speech.create(
        model="gpt-4o-mini-tts", voice={"id": "echo"}, input=TEXT, response_format="pcm"
    )
    assert response.response.headers["x-sample-rate"] == "24000"
    response = sdk.audio.speech.create(
        model="tts-1-hd",
        voice="joe",
        input=TEXT,
        response_format="pcm",
        extra_body={"sample_rate": 16000},
    )
    assert response.response.headers["x-sample-rate"] == "16000"
    at_16k = len(response.content) / 2 / 16000
    assert abs(at_16k * 1000 - engine_audio_ms(piper_server, TEXT)) <= TOLERANCE_MS


def test_speed_shortens_audio(piper_server: RunningServer) -> None:
    sdk = client(piper_server)
    normal = sdk.audio.speech.create(model="tts-1", voice="joe", input=TEXT, response_format="pcm")
    fast = sdk.audio.speech.create(
        model="tts-1", voice="joe", input=TEXT, response_format="pcm", speed=2.0
    )
    assert len(fast.content) < 0.7 * len(normal.content)


def test_streaming_response_first_chunk_while_synthesizing(piper_server: RunningServer) -> None:
    sdk = client(piper_server)
    with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=LONG, response_format="pcm"
    ) as response:
        assert response.headers["x-sample-rate"] == "24000"
        chunks = response.iter_bytes()
        first = next(chunks)
        assert first
        # the response is still being produced: the server says so
        assert metric(piper_server.http, "gateway_http_streams_active") >= 1
        assert metric(piper_server.http, "gateway_engine_live_jobs") >= 1
        total = len(first) + sum(len(c) for c in chunks)
    assert total / 2 / 24000 > 10  # the whole long input arrived
    deadline = time.monotonic() + 5
    while metric(piper_server.http, "gateway_http_streams_active") > 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_sse_events(piper_server: RunningServer) -> None:
    with httpx.stream(
        "POST",
        piper_server.http + "/v1/audio/speech",
        json={
            "model": "tts-1",
            "voice": "alloy",
            "input": TEXT,
            "response_format": "pcm",
            "stream_format": "sse",
        },
        timeout=60,
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-sample-rate"] == "24000"
        lines = list(response.iter_lines())
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    # vllm-omni 0.30's form: an event line names each data line's type
    assert [line[7:] for line in lines if line.startswith("event: ")] == [e["type"] for e in events]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert abs(len(pcm) / 2 / 24 - events[-1]["audio_ms"]) < 1
    usage = events[-1]["usage"]
    assert usage["input_tokens"] == len(TEXT)


def test_stream_true_with_stream_format_audio_is_a_streamed_body(
    piper_server: RunningServer,
) -> None:
    """vllm-omni 0.30's raw stream (its benchmark's request): ``stream: true``
    with ``stream_format: "audio"``; ``stream: true`` alone is SSE
    (tests/http/test_http_vllm_omni.py)."""
    response = httpx.post(
        piper_server.http + "/v1/audio/speech",
        json={
            "voice": "joe",
            "input": TEXT,
            "response_format": "wav",
            "stream": True,
            "stream_format": "audio",
        },
        timeout=60,
    )
    assert response.status_code == 200
    assert "content-length" not in response.headers
    audio, sr = decode(response.content, "wav")
    assert sr == 24000 and len(audio) > sr


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"voice": "nobody"}, 400, "unknown_voice", "voice"),
        ({"response_format": "aac"}, 400, "unsupported_option", "response_format"),
        ({"response_format": "ogg"}, 400, "invalid_config", "response_format"),
        ({"instructions": "whisper it"}, 400, "unsupported_option", "instructions"),
        ({"speed": 9}, 400, "invalid_config", "speed"),
        ({"model": "tts-9"}, 400, "invalid_config", "model"),
        ({"response_format": "opus", "sample_rate": 22050}, 400, "unsupported_option", None),
        ({"language": "de"}, 400, "unsupported_option", "language"),
        ({"input": ""}, 400, "invalid_message", "input"),
        ({"input": "Hello\x00 world."}, 400, "invalid_message", "input"),
        ({"input": "?!"}, 400, "invalid_message", "input"),
        ({"input": "x" * 131073}, 400, "text_too_long", "input"),
        ({"seed": 2**63}, 400, "invalid_config", "seed"),
        ({"task_type": "Base", "ref_audio": "https://a/b.wav"}, 400, "unsupported_option", None),
        ({"ref_text": "Hi."}, 400, "unsupported_option", "ref_text"),
    ],
)
def test_errors_in_openai_shape(
    piper_server: RunningServer, body: dict[str, object], status: int, code: str, param: str | None
) -> None:
    request = {"model": "tts-1", "voice": "alloy", "input": TEXT} | body
    response = httpx.post(piper_server.http + "/v1/audio/speech", json=request, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param


def test_unknown_voice_lists_available_and_sdk_raises(piper_server: RunningServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(piper_server).audio.speech.create(model="tts-1", voice="nobody", input=TEXT)
    message = str(info.value)
    assert "joe" in message and "alloy" in message


def test_vllm_omni_fields_at_their_defaults_are_accepted(piper_server: RunningServer) -> None:
    """vllm-omni's speech client sends its extension fields; at their
    defaults they change nothing and are not refused."""
    body = {
        "input": "Hi there.",
        "voice": "joe",
        "response_format": "wav",
        "task_type": "CustomVoice",
        "language": "Auto",
        "instructions": "",
        "max_new_tokens": 2048,
        "non_streaming_mode": False,
        "ref_audio": "",
    }
    response = httpx.post(piper_server.http + "/v1/audio/speech", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert len(decode(response.content, "wav")[0]) > 0


def test_empty_instructions_are_accepted(piper_server: RunningServer) -> None:
    response = client(piper_server).audio.speech.create(
        model="tts-1", voice="alloy", input="Hi there.", instructions="", response_format="wav"
    )
    assert decode(response.content, "wav")[1] == 24000


def test_a_request_beyond_max_http_streams_waits_and_is_then_served(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(max_http_streams=1, admission_deadline_s=120.0)
    body = {"voice": "joe", "input": TEXT, "response_format": "pcm", "stream_format": "audio"}
    with httpx.stream(
        "POST",
        server.http + "/v1/audio/speech",
        json={"voice": "joe", "input": TEXT * 3, "response_format": "pcm"},
        timeout=60,
    ) as first:
        chunks = first.iter_bytes()
        next(chunks)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            second = pool.submit(
                httpx.post, server.http + "/v1/audio/speech", json=body, timeout=60
            )
            deadline = time.monotonic() + 10
            while metric(server.http, 'gateway_admission_queue_depth{surface="http"}') != 1:
                assert time.monotonic() < deadline, "the second request never queued"
                time.sleep(0.02)
            assert not second.done()
            for _ in chunks:  # the first finishes: its slot passes to the second
                pass
            answer = second.result(timeout=60)
    assert answer.status_code == 200 and len(answer.content) > 1000, answer.text
    assert metric(server.http, 'gateway_admission_wait_seconds_count{surface="http"}') == 2


@contextlib.contextmanager
def _slot_held(server: RunningServer) -> Iterator[None]:
    """A long streamed request holding an HTTP slot, its first audio read;
    its connection closed on exit."""
    with httpx.stream(
        "POST",
        server.http + "/v1/audio/speech",
        json={"voice": "joe", "input": LONG * 8, "response_format": "pcm"},
        timeout=60,
    ) as first:
        chunks = first.iter_bytes()  # kept: a dropped iterator closes the connection
        next(chunks)
        yield


def test_a_request_whose_client_leaves_while_queued_leaves_the_queue(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Its place is given up when the client disconnects, not when a slot
    comes free: the queue is empty again while the first request still
    holds the one slot, and the slot later goes to nobody stale."""
    server = server_factory(max_http_streams=1, admission_deadline_s=120.0)
    gate = server.state.http_admission
    body = json.dumps({"voice": "joe", "input": TEXT, "response_format": "pcm"}).encode()
    with _slot_held(server):
        host, port = server.http.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as waiting:
            waiting.sendall(
                b"POST /v1/audio/speech HTTP/1.1\r\nHost: " + host.encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body
            )  # fmt: skip
            deadline = time.monotonic() + 10
            while gate.queue.depth != 1:
                assert time.monotonic() < deadline, "the second request never queued"
                time.sleep(0.02)
        deadline = time.monotonic() + 5
        while gate.queue.depth:
            assert time.monotonic() < deadline, "the gone request stayed in the queue"
            time.sleep(0.02)
        assert gate.active == 1  # the first still holds the slot
    # the first client leaves too: its slot is free for the next request
    answer = httpx.post(
        server.http + "/v1/audio/speech",
        json={"voice": "joe", "input": TEXT, "response_format": "pcm"},
        timeout=60,
    )
    assert answer.status_code == 200 and answer.content
    deadline = time.monotonic() + 5  # released once the response has closed
    while gate.active:
        assert time.monotonic() < deadline, "a slot stayed held"
        time.sleep(0.02)
    assert gate.queue.depth == 0


def test_a_request_past_the_deadline_is_busy_with_retry_after(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(max_http_streams=1, admission_deadline_s=0.2)
    with _slot_held(server):
        assert metric(server.http, "gateway_http_streams_active") == 1
        second = httpx.post(
            server.http + "/v1/audio/speech",
            json={"voice": "joe", "input": TEXT, "response_format": "pcm"},
            timeout=30,
        )
        assert second.status_code == 503 and second.headers["Retry-After"] == "1"
        error = second.json()["error"]
        assert error["code"] == "busy" and "within 0.2 s" in error["message"]
        refused = 'gateway_admission_refused_total{reason="deadline",surface="http"}'
        assert metric(server.http, refused) == 1


async def test_disconnect_stops_engine_work(piper_server: RunningServer) -> None:
    def live() -> float:
        return metric(piper_server.http, "gateway_engine_live_jobs")

    baseline_deadline = time.monotonic() + 10
    while live() > 0:
        assert time.monotonic() < baseline_deadline
        await asyncio.sleep(0.05)
    sentences_before = metric(piper_server.http, "gateway_sentences_total")
    segments = 12 * 8
    async with (
        httpx.AsyncClient(timeout=60) as http,
        http.stream(
            "POST",
            piper_server.http + "/v1/audio/speech",
            json={"voice": "joe", "input": LONG * 8, "response_format": "pcm"},
        ) as response,
    ):
        async for chunk in response.aiter_bytes():
            assert chunk
            break
        assert live() >= 1
        # leaving the block closes the connection mid-body
    deadline = time.monotonic() + 5
    while live() > 0 or metric(piper_server.http, "gateway_http_streams_active") > 0:
        assert time.monotonic() < deadline, "engine work went on after the client left"
        await asyncio.sleep(0.05)
    spoken = metric(piper_server.http, "gateway_sentences_total") - sentences_before
    assert spoken < segments / 2, f"{spoken} of {segments} segments synthesized"


def test_every_format_is_known() -> None:
    assert set(PROMISED) | {"aac"} == set(RESPONSE_FORMATS)
