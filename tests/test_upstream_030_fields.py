"""vllm-omni 0.30's ``seed`` and ``word_timestamps`` through the upstream
engine, between two real gateways: a Piper replica in a process of its own
(``python -m gateway serve``, its sampling on, so a seed matters) and a
gateway in ``upstream`` mode in front (in-process, real uvicorn).  The
front forwards ``seed`` when ``upstream.seed`` declares the replica takes
it, and asks for word timings when ``upstream.word_timestamps`` declares
the replica gives them (on a whole file, the only place 0.30's HTTP API
gives them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as settings_for
from tests.helpers import ServeProcess, Transcript, open_ws, recv_until, send, serve_process

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
#: the replica's voice at its own rate: neither gateway resamples
BODY = {"voice": "joe", "response_format": "pcm", "sample_rate": 22050, "stream": False}


@pytest.fixture(scope="module")
def piper_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    data = tmp_path_factory.mktemp("piper-replica")
    # the tests' extracted Piper models (``test_settings``' data_dir), not a new extraction
    shared = Path(settings_for().data_dir).resolve() / "models"
    (data / "models").symlink_to(shared, target_is_directory=True)
    with serve_process(data, engine="piper", piper_deterministic="false") as replica:
        yield replica


@contextmanager
def front(replica: ServeProcess, **upstream: Any) -> Iterator[RunningServer]:
    config = {
        "urls": [replica.base],
        "health_path": "/healthz",
        "ready_paths": ["/v1/audio/voices"],
        "probe_interval_s": 0.2,
        "send_sample_rate": True,
        **upstream,
    }
    with run_server(settings_for(engine="upstream", upstream=config), None) as server:
        yield server


def speak(base: str, **extra: Any) -> httpx.Response:
    body = {"input": SENTENCE, **BODY, **extra}
    response = httpx.post(base + "/v1/audio/speech", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response


def bare(words: list[str]) -> list[str]:
    return [w.strip(".,").casefold() for w in words]


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.int32)


def test_a_seeded_request_through_the_upstream_is_the_replicas_own_audio(
    piper_replica: ServeProcess,
) -> None:
    with front(piper_replica, seed=True) as gw:
        direct = speak(piper_replica.base, seed=7).content
        relayed = speak(gw.http, seed=7).content
        again = speak(gw.http, seed=7).content
        other = speak(gw.http, seed=8).content
    assert len(relayed) == len(direct) > 0
    # the same bytes, up to one LSB of the relay's float round trip
    assert np.abs(pcm(relayed) - pcm(direct)).max() <= 1
    assert again == relayed
    assert len(other) != len(relayed) or np.abs(pcm(other) - pcm(relayed)).max() > 100


def test_a_seed_is_refused_by_name_unless_the_upstream_declares_it(
    piper_replica: ServeProcess,
) -> None:
    with front(piper_replica) as gw:
        body = {"input": SENTENCE, **BODY, "seed": 7}
        response = httpx.post(gw.http + "/v1/audio/speech", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_option", "seed")


def _words(response: httpx.Response) -> list[dict[str, Any]]:
    words: list[dict[str, Any]] = json.loads(response.headers["x-word-timestamps"])
    return words


def test_word_timestamps_come_back_through_the_upstream(piper_replica: ServeProcess) -> None:
    with front(piper_replica, seed=True, word_timestamps=True) as gw:
        direct = speak(piper_replica.base, seed=3, word_timestamps=True)
        relayed = speak(gw.http, seed=3, word_timestamps=True)
    want, got = _words(direct), _words(relayed)
    assert [w["word"] for w in got] == [w["word"] for w in want]
    assert bare([w["word"] for w in got]) == bare(SENTENCE.split())
    for mine, theirs in zip(got, want, strict=True):
        assert abs(mine["start_ms"] - theirs["start_ms"]) <= 1
        assert abs(mine["end_ms"] - theirs["end_ms"]) <= 1


async def test_word_timestamps_through_the_upstream_on_the_websocket(
    piper_replica: ServeProcess,
) -> None:
    """vllm-omni 0.30's JSON ``audio.chunk`` frames: the sentence's closing
    chunk carries its words, timed by the replica."""
    with front(piper_replica, word_timestamps=True) as gw:
        async with await open_ws(gw.ws_url) as ws:
            await ws.recv()
            await send(
                ws,
                type="session.config",
                voice="joe",
                response_format="pcm",
                stream_audio=True,
                word_timestamps=True,
            )
            await send(ws, type="input.text", text=SENTENCE)
            await send(ws, type="input.done")
            transcript = await recv_until(ws, Transcript())
    timed = [
        e["timestamps"]
        for e in transcript.events
        if e["type"] == "audio.chunk" and e.get("timestamps")
    ]
    assert bare([w["word"] for words in timed for w in words]) == bare(SENTENCE.split())
