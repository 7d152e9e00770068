"""The ``upstream`` engine against real upstreams: ``python -m gateway
serve`` processes (synthetic engine) as replicas, a gateway in ``upstream``
mode in front (in-process, real uvicorn), and ``tests/faultproxy.py`` (a
real TCP relay) between them to inject faults.  Nothing here mocks the
upstream: it is the gateway's own ``/v1/audio/speech``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gateway.engines.pool.routing import ReplicaState
from gateway.engines.upstream.engine import UpstreamEngine
from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as settings_for
from tests.faultproxy import FaultProxy, Faults
from tests.helpers import ServeProcess, Transcript, open_ws, recv_until, send, serve_process

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
TWO = "The lighthouse stood on the cliff. Its lamp turned over the dark water."
LONG = (
    "The old lighthouse stood at the edge of the cliff for a hundred years, and every"
    " night its lamp turned slowly over the dark water while sailors far away counted"
    " the flashes and knew where the rocks were, and the keeper climbed the stairs."
)
STREAM = {"response_format": "pcm", "stream_audio": True, "frame_ms": 20}
#: fault tests: no probes (their requests would share the proxied connections)
PASSIVE = {
    "health_path": "",
    "ready_paths": [],
    "native_rate": 22050,
    "voices": ["tone"],
}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServeProcess]]:
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                serve_process(tmp_path_factory.mktemp(f"replica{i}"), engine="synthetic")
            )
            for i in range(2)
        ]


@contextmanager
def front(urls: list[str], **upstream: Any) -> Iterator[RunningServer]:
    config = {
        "urls": urls,
        "health_path": "/healthz",
        "ready_paths": ["/v1/audio/voices"],
        "probe_interval_s": 0.2,
        "cooldown_s": 1.0,
        "send_sample_rate": True,  # the replicas' own rate: no resampling twice
        **upstream,
    }
    with run_server(settings_for(engine="upstream", upstream=config), None) as server:
        yield server


@contextmanager
def proxies(*targets: ServeProcess) -> Iterator[list[FaultProxy]]:
    made = [FaultProxy(t.port) for t in targets]
    try:
        yield made
    finally:
        for proxy in made:
            proxy.close()


def engine_of(server: RunningServer) -> UpstreamEngine:
    engine = server.state.engine
    assert isinstance(engine, UpstreamEngine)
    return engine


async def speech(base: str, text: str, **extra: Any) -> httpx.Response:
    body = {"input": text, "voice": "tone", "response_format": "pcm", "sample_rate": 22050, **extra}
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(base + "/v1/audio/speech", json=body)


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(url)


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.int32)


def assert_same_audio(got: bytes, want: bytes) -> None:
    assert len(got) == len(want) > 0
    assert np.abs(pcm(got) - pcm(want)).max() <= 1  # one LSB of re-encoding


async def test_relayed_audio_is_the_upstreams_own(replicas: list[ServeProcess]) -> None:
    with front([r.base for r in replicas]) as gw:
        assert (await get(gw.http + "/readyz")).json() == {
            "status": "ready",
            "engine": "upstream",
            "saturated": False,
        }
        voices = (await get(gw.http + "/v1/audio/voices")).json()
        tone = next(v for v in voices["data"] if v["name"] == "tone")
        assert tone["sample_rate"] == 22050 and tone["engine"] == "upstream"
        direct = await speech(replicas[0].base, TWO)
        relayed = await speech(gw.http, TWO)
        assert relayed.status_code == 200
        assert_same_audio(relayed.content, direct.content)
        # the WebSocket protocol over the pool, at the upstream's native rate
        async with await open_ws(gw.ws_url) as ws:
            created = json.loads(await ws.recv())
            assert created["engine"] == "upstream"
            await send(ws, type="session.config", sample_rate=22050, **STREAM)
            await send(ws, type="input.text", text=TWO)
            await send(ws, type="input.done")
            t = await recv_until(ws, Transcript())
        assert not t.of("error")
        assert len(t.of("audio.done")) == 2
        assert not t.of("alignment")  # no timings are invented
        audio = b"".join(b[-(len(b) // 2) * 2 :] for b in t.binary)
        assert len(audio) >= len(direct.content) - 64
        metrics = (await get(gw.http + "/metrics")).text
        assert "gateway_upstream_requests_total" in metrics
        assert "@" not in metrics.split("gateway_upstream")[1]  # no credentials in labels


@pytest.mark.parametrize(
    ("stream_format", "response_format"),
    [("audio", "wav"), ("sse", "pcm"), ("sse", "wav")],
)
async def test_every_body_shape_relays_the_same_audio(
    replicas: list[ServeProcess], stream_format: str, response_format: str
) -> None:
    shape = {"stream_format": stream_format, "response_format": response_format}
    with front([replicas[0].base], **PASSIVE, **shape) as gw:
        direct = await speech(replicas[0].base, TWO)
        relayed = await speech(gw.http, TWO)
        assert relayed.status_code == 200
        assert_same_audio(relayed.content, direct.content)


async def test_a_real_voice_relayed(piper_server: RunningServer) -> None:
    """Piper behind the relay: the words the listener gets are the replica's."""
    with front([piper_server.http]) as gw:  # voices and rate from its listing
        body = {"voice": "joe", "sample_rate": 22050}
        direct = await speech(piper_server.http, SENTENCE, **body)
        relayed = await speech(gw.http, SENTENCE, **body)
        assert relayed.status_code == 200
        assert_same_audio(relayed.content, direct.content)
        assert engine_of(gw).default_voice().name == "joe"


async def test_voices_are_merged_and_routed_to_the_replicas_holding_them(
    piper_server: RunningServer, replicas: list[ServeProcess]
) -> None:
    """A voice only some replicas list goes to those (uploaded voices live
    per server on vllm-omni); here Piper's ``joe`` and the synthetic ``tone``."""
    with front([piper_server.http, replicas[0].base]) as gw:
        listed = (await get(gw.http + "/v1/audio/voices")).json()["voices"]
        assert {"joe", "tone"} <= set(listed)
        for voice in ("joe", "tone", "joe", "tone", "joe", "tone"):
            response = await speech(gw.http, "Hello there.", voice=voice)
            assert response.status_code == 200, response.text
        pool = engine_of(gw).client.pool
        assert [r.requests for r in pool.replicas] == [3, 3]
        assert all(not r.failures for r in pool.replicas)


async def test_the_next_segment_is_prefetched_while_one_plays(
    replicas: list[ServeProcess],
) -> None:
    with front([replicas[0].base], **PASSIVE) as gw:
        pool = engine_of(gw).client.pool
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, pool.replicas[0].outstanding)
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        async with await open_ws(gw.ws_url) as ws:
            await ws.recv()
            await send(ws, type="session.config", split_granularity="sentence", **STREAM)
            await send(ws, type="input.text", text=f"{TWO} {SENTENCE}")
            await send(ws, type="input.done")
            t = await recv_until(ws, Transcript())
        watcher.cancel()
        assert len(t.of("audio.done")) == 3 and not t.of("error")
        assert most >= 2  # segment n+1 was requested while n was streaming


async def test_the_upstream_model_name_is_accepted(replicas: list[ServeProcess]) -> None:
    # the replica's own model name (this gateway accepts its engine's name)
    with front([replicas[0].base], **PASSIVE, model="synthetic") as gw:
        assert (await speech(gw.http, "Hello there.", model="synthetic")).status_code == 200
        assert (await speech(gw.http, "Hello there.", model="tts-1")).status_code == 200
        assert (await speech(gw.http, "Hello there.", model="nonesuch")).status_code == 400
        async with await open_ws(gw.ws_url) as ws:
            await ws.recv()
            await send(ws, type="session.config", model="synthetic", **STREAM)
            await send(ws, type="input.text", text="Hello there.")
            await send(ws, type="input.done")
            t = await recv_until(ws, Transcript())
        assert not t.of("error") and t.binary


async def test_instructions_and_language_reach_an_upstream_that_declares_them(
    replicas: list[ServeProcess],
) -> None:
    """Protocol 1.2.0: a style prompt (WebSocket and HTTP) and the language
    in force go into the upstream's request body; the synthetic replica has
    no style prompt, so the body is read at a proxy, not from its answer."""
    with (
        proxies(replicas[0]) as (proxy,),
        front([proxy.url], **PASSIVE, instructions=True, send_language=True) as gw,
    ):
        async with await open_ws(gw.ws_url) as ws:
            created = json.loads(await ws.recv())
            assert created["capabilities"]["instructions"] is True
            await send(ws, type="session.config", instructions=" Whisper it. ", **STREAM)
            updated = await recv_until(ws, Transcript(), stop="session.updated")
            assert updated.of("session.updated")[0]["config"]["instructions"] == "Whisper it."
            await send(ws, type="input.text", text="Hello there.")
            await send(ws, type="input.done")
            await recv_until(ws, Transcript())
        await speech(gw.http, "Hello again.", instructions="Shout it.")
        bodies = [bytes(c.request_sample) for c in proxy.connections]
        sent = b"".join(bodies)
        assert b'"instructions":"Whisper it."' in sent and b'"instructions":"Shout it."' in sent
        assert b'"language":"English"' in sent  # vllm-omni's spelling of the session's language


async def test_voice_clone_fields_reach_an_upstream_that_clones(
    replicas: list[ServeProcess],
) -> None:
    """vllm-omni's Base-task fields (WebSocket ``session.config`` and HTTP)
    go into the upstream's request body when ``upstream.cloning`` is on."""
    clone = {"task_type": "Base", "ref_audio": "data:audio/wav;base64,UklGRg==", "ref_text": "Hi."}
    with (
        proxies(replicas[0]) as (proxy,),
        front([proxy.url], **PASSIVE, cloning=True) as gw,
    ):
        async with await open_ws(gw.ws_url) as ws:
            await ws.recv()
            await send(ws, type="session.config", **clone, **STREAM)
            await recv_until(ws, Transcript(), stop="session.updated")
            await send(ws, type="input.text", text="Hello there.")
            await send(ws, type="input.done")
            await recv_until(ws, Transcript())
        await speech(gw.http, "Hello again.", **clone)
        sent = b"".join(bytes(c.request_sample) for c in proxy.connections)
        assert sent.count(b"POST /v1/audio/speech") == 2  # kept-alive: one connection
        for value in (b'"task_type":"Base"', b'"ref_text":"Hi."', b"UklGRg=="):
            assert sent.count(value) == 2, sent[-300:]  # both requests carried it


async def test_030_clone_fields_reach_an_upstream_that_clones(
    replicas: list[ServeProcess],
) -> None:
    """vllm-omni 0.30's other clone fields: ``speaker_embedding`` (WebSocket
    and HTTP, a vector or vectors), ``ref_audio_2`` and a list-valued
    ``ref_audio`` go into the upstream's body as the client sent them."""
    with (
        proxies(replicas[0]) as (proxy,),
        front([proxy.url], **PASSIVE, cloning=True) as gw,
    ):
        async with await open_ws(gw.ws_url) as ws:
            await ws.recv()
            await send(ws, type="session.config", speaker_embedding=[0.5, -0.25], **STREAM)
            await recv_until(ws, Transcript(), stop="session.updated")
            await send(ws, type="input.text", text="Hello there.")
            await send(ws, type="input.done")
            await recv_until(ws, Transcript())
        await speech(
            gw.http,
            "Hello again.",
            speaker_embedding=[[0.125, 1.0]],
            ref_audio=["data:audio/wav;base64,QUFB", "data:audio/wav;base64,QkJC"],
            ref_audio_2="data:audio/wav;base64,Q0ND",
        )
        sent = b"".join(bytes(c.request_sample) for c in proxy.connections)
        assert b'"speaker_embedding":[0.5,-0.25]' in sent
        assert b'"speaker_embedding":[[0.125,1.0]]' in sent
        assert b'"ref_audio":["data:audio/wav;base64,QUFB","data:audio/wav;base64,QkJC"]' in sent
        assert b'"ref_audio_2":"data:audio/wav;base64,Q0ND"' in sent


async def test_failover_before_the_first_byte(replicas: list[ServeProcess]) -> None:
    with proxies(replicas[0]) as (bad,):
        bad.faults = Faults(reset=True)
        with front([bad.url, replicas[1].base], **PASSIVE) as gw:
            want = (await speech(replicas[1].base, SENTENCE)).content
            for _ in range(2):
                got = await speech(gw.http, SENTENCE)
                assert got.status_code == 200
                assert_same_audio(got.content, want)
            first = engine_of(gw).client.pool.replicas[0]
            assert first.requests >= 1 and sum(first.failures.values()) == first.requests
        assert bad.connections  # the reset really happened at the proxy


async def test_partial_audio_fails_the_segment_and_is_never_retried(
    replicas: list[ServeProcess],
) -> None:
    with proxies(*replicas) as (cutting, spare):
        cutting.faults = Faults(cut_after=30_000)  # headers and about 0.3 s of audio
        with front([cutting.url, spare.url], **PASSIVE) as gw:
            async with await open_ws(gw.ws_url) as ws:
                await ws.recv()
                await send(ws, type="session.config", **STREAM)
                await send(ws, type="input.text", text=SENTENCE)
                await send(ws, type="input.done")
                t = await recv_until(ws, Transcript())
                errors = t.of("error")
                assert len(errors) == 1
                assert errors[0]["partial_audio"] is True
                assert "after" in errors[0]["message"] and "ms of this" in errors[0]["message"]
                assert t.binary  # part of it was heard
                assert t.of("audio.done")[0]["error"] is True
                # never retried elsewhere after the first byte
                assert spare.connections == []
                # the session goes on
                cutting.faults = Faults()
                await send(ws, type="input.text", text="Back again.")
                await send(ws, type="input.done")
                t2 = await recv_until(ws, Transcript())
                assert not t2.of("error") and t2.binary


async def test_a_refused_request_fails_alone_without_retry_or_ejection(
    replicas: list[ServeProcess],
) -> None:
    """A 4xx that is the request's fault (a voice the replicas do not have)."""
    with (
        proxies(*replicas) as (first, second),
        front([first.url, second.url], **{**PASSIVE, "voices": ["tone", "ghost"]}) as gw,
    ):
        for _ in range(4):
            refused = await speech(gw.http, "Hello there.", voice="ghost")
            assert refused.status_code == 400  # the client's mistake, not a server error
            assert refused.json()["error"]["code"] == "engine_refused"
            assert "refused" in refused.text or "ghost" in refused.text
        # the WebSocket client hears the same code, beside the sentence's audio.done
        async with await open_ws(gw.ws_url) as ws:
            await ws.recv()
            await send(ws, type="session.config", voice="ghost", **STREAM)
            await send(ws, type="input.text", text="Hello there.")
            await send(ws, type="input.done")
            t = await recv_until(ws, Transcript())
        (error,) = t.of("error")
        assert error["code"] == "engine_refused" and error["action"] == "sentence_skipped"
        assert t.of("audio.done")[0]["error"] is True and not t.binary
        pool = engine_of(gw).client.pool
        assert sum(r.requests for r in pool.replicas) == 5  # one attempt each, no retry
        assert all(r.state is ReplicaState.READY for r in pool.replicas)
        assert (await speech(gw.http, "Hello there.")).status_code == 200


async def test_a_full_replica_is_skipped_never_ejected(
    replicas: list[ServeProcess], tmp_path: Path
) -> None:
    """503 ``busy`` from a real replica whose one HTTP slot is taken."""
    with (
        serve_process(tmp_path, engine="synthetic", max_http_streams=1) as small,
        front([small.base, replicas[1].base], **PASSIVE) as gw,
    ):
        body = {"input": LONG * 3, "voice": "tone", "response_format": "pcm"}
        async with (
            httpx.AsyncClient(timeout=30) as hog,
            hog.stream("POST", small.base + "/v1/audio/speech", json=body) as held,
        ):
            assert held.status_code == 200  # its one slot, held: we do not read
            for _ in range(5):
                assert (await speech(gw.http, "Hello there.")).status_code == 200
            full = engine_of(gw).client.pool.replicas[0]
            assert full.failures.get("http_503", 0) >= 1
            assert full.state is ReplicaState.READY and full.ejections == 0


async def test_ejection_and_return_of_a_dead_replica(replicas: list[ServeProcess]) -> None:
    with (
        proxies(replicas[0]) as (dying,),
        front([dying.url, replicas[1].base], **PASSIVE, cooldown_s=3.0) as gw,
    ):
        pool = engine_of(gw).client.pool
        dying.refuse()
        for _ in range(6):
            assert (await speech(gw.http, "Hello there.")).status_code == 200
        dead = pool.replicas[0]
        assert dead.requests == 3  # three failures, then ejected: no more tries
        assert dead.state is ReplicaState.EJECTED and dead.ejections == 1
        metrics = (await get(gw.http + "/metrics")).text
        assert f'replica="{dying.url}",state="ejected"}} 1.0' in metrics
        assert (await get(gw.http + "/readyz")).status_code == 200  # the other one serves
        dying.resume()
        await asyncio.sleep(3.1)  # the cool-down: 3 s, so a loaded machine still saw "ejected"
        for _ in range(4):
            assert (await speech(gw.http, "Hello there.")).status_code == 200
        assert dead.requests > 3 and dead.state is ReplicaState.READY
        assert dead.consecutive_failures == 0


async def test_readyz_follows_the_probes(replicas: list[ServeProcess]) -> None:
    with proxies(replicas[0]) as (only,), front([only.url]) as gw:

        async def wait_status(code: int) -> None:
            async with asyncio.timeout(5):
                while (await get(gw.http + "/readyz")).status_code != code:
                    await asyncio.sleep(0.05)

        await wait_status(200)
        only.refuse()
        await wait_status(503)
        assert (await get(gw.http + "/readyz")).json()["status"] == "engine_unavailable"
        only.resume()
        await wait_status(200)


class StallWatch:
    """The longest this process went without running a 10 ms ticker thread
    (the host's steal, a long pause of the interpreter): a stall measured
    while a test times something voids that try, so the test tries again
    rather than blaming the gateway for the machine."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def _tick(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.01):
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            last = now

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def relay_state(gw: RunningServer) -> str:
    """Where the front's event loop and its segment tasks are, for a failure's
    message."""
    frame = sys._current_frames().get(gw.thread.ident or 0)
    lines = ["front's thread:", *(traceback.format_stack(frame)[-6:] if frame else ["gone"])]
    for task in list(engine_of(gw).tasks):
        lines.append(f"task {task.get_name()} done={task.done()}:")
        lines += [f"  {f.f_code.co_filename}:{f.f_lineno}" for f in task.get_stack()]
    return "\n".join(lines)


async def cancel_and_time_the_close(replica: ServeProcess) -> tuple[float, str]:
    """Seconds from a cancel to the front closing its upstream connection
    (inf: still open 5 s after), and the front's state for a message."""
    with proxies(replica) as (watched,), front([watched.url], **PASSIVE) as gw:
        # the replica's response stops after about 0.6 s of audio and stays
        # open, so it is surely still streaming when the cancel comes (a fast
        # replica could otherwise have sent it all, leaving an idle keep-alive
        # connection that a cancel has no reason to close); nothing else
        # closes it for read_timeout_s (10 s)
        watched.faults = Faults(stall_after=30_000)
        async with await open_ws(gw.ws_url) as ws:
            await ws.recv()
            await send(ws, type="session.config", split_granularity="sentence", **STREAM)
            await send(ws, type="input.text", text=LONG)
            await send(ws, type="input.done")
            t = Transcript()
            while len(t.binary) < 10:
                raw = await asyncio.wait_for(ws.recv(), 30)
                t.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
            (conn,) = watched.connections
            assert conn.closed_by_client is None  # the response is still streaming
            cancelled = time.monotonic()
            await send(ws, type="cancel")
            await recv_until(ws, t)
            assert t.of("audio.cancelled")
            with suppress(TimeoutError):
                async with asyncio.timeout(5):
                    while conn.closed_by_client is None:
                        await asyncio.sleep(0.005)
            if conn.closed_by_client is None:
                return math.inf, relay_state(gw)
            return conn.closed_by_client - cancelled, relay_state(gw)


async def test_cancel_closes_the_upstream_request(replicas: list[ServeProcess]) -> None:
    for _ in range(3):
        with StallWatch() as watch:
            took, state = await cancel_and_time_the_close(replicas[0])
        if watch.worst < 0.5:
            break
    assert watch.worst < 0.5, f"this machine stalled for {watch.worst:.2f} s in every try"
    assert took < 0.1, f"the upstream connection closed {took:.3f} s after the cancel\n{state}"


async def test_a_slow_upstream_never_blocks_other_sessions(replicas: list[ServeProcess]) -> None:
    """Events, not wall time: replica 0 holds its answers until released,
    and another session gets its first audio while it still holds them (it
    has sent no byte); released, the held session is answered by the slow
    replica (the first-byte timeout is far off)."""
    with proxies(*replicas) as (slow, fast):
        held = threading.Event()
        slow.faults = Faults(hold=held)
        with front([slow.url, fast.url], first_byte_timeout_s=120.0, **PASSIVE) as gw:

            async def first_audio(text: str) -> None:
                async with await open_ws(gw.ws_url) as ws:
                    await ws.recv()
                    await send(ws, type="session.config", **STREAM)
                    await send(ws, type="input.text", text=text)
                    await send(ws, type="input.done")
                    while not isinstance(await asyncio.wait_for(ws.recv(), 60), bytes):
                        pass

            stuck = asyncio.create_task(first_audio(SENTENCE))  # the first pick: replica 0
            try:
                async with asyncio.timeout(30):
                    while not slow.connections:
                        await asyncio.sleep(0.01)
                await first_audio("Hello there.")
                # it did not wait behind the slow replica, which still holds
                # every answer it was asked for
                assert all(c.response_bytes == 0 for c in slow.connections), slow.connections
            finally:
                held.set()
            await stuck
            assert slow.connections[0].response_bytes > 0  # the slow replica answered it
            assert len(fast.connections) >= 1


async def test_credentials_never_reach_logs_or_metrics(
    replicas: list[ServeProcess], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret_url = f"http://user:s3cr3t@127.0.0.1:{replicas[0].port}"
    dead = "http://user:s3cr3t@127.0.0.1:9"  # nothing listens: failures get logged
    with front([secret_url, dead], api_key="k3y-s3cr3t") as gw:
        assert (await speech(gw.http, "Hello there.")).status_code == 200
        await asyncio.sleep(0.5)  # a few probe rounds, the dead one failing
        metrics = (await get(gw.http + "/metrics")).text
    assert "gateway_upstream_requests_total" in metrics
    assert "upstream replica http://127.0.0.1:9 is unready" in caplog.text  # logs were seen
    for text in (metrics, caplog.text):
        assert "s3cr3t" not in text and "user:" not in text


def test_settings_from_the_environment(tmp_path: Path) -> None:
    from gateway.settings import load_settings

    settings = load_settings(
        None,
        environ={
            "GATEWAY_ENGINE": "upstream",
            "GATEWAY_UPSTREAM_URLS": "http://a:8000, http://user:secret@b:8000/",
            "GATEWAY_UPSTREAM_MAX_PER_REPLICA": "4",
        },
    )
    assert settings.upstream.urls == ["http://a:8000", "http://user:secret@b:8000/"]
    assert settings.upstream.max_per_replica == 4
    engine = UpstreamEngine(settings)
    assert [r.name for r in engine.client.pool.replicas] == ["http://a:8000", "http://b:8000"]


async def test_a_segment_over_max_item_chars_is_several_requests(
    replicas: list[ServeProcess],
) -> None:
    """Bounded work per item: a sentence whose engine text is over
    ``upstream.max_item_chars`` is requested in pieces cut at clauses, one
    after another, and spoken whole (issue 28)."""
    text = (
        "one two three four five six seven, eight nine ten eleven twelve thirteen,"
        " fourteen fifteen sixteen seventeen."
    )
    with front([replicas[0].base], max_item_chars=60) as gw:
        whole = await speech(gw.http, text, normalize=False)
        assert whole.status_code == 200, whole.text
        engine = engine_of(gw)
        assert engine.client.pool.replicas[0].requests == 3  # one a clause
        assert 0 < engine.largest_work_item() <= 60
        assert engine.capabilities.max_work_item == 60
        assert engine.capabilities.work_item_unit == "characters"
        assert len(whole.content) > 0
