"""Uploaded voices across the upstream pool, with real replicas: ``python -m
gateway serve`` processes (synthetic engine) behind a gateway in
``upstream`` mode with ``upstream.cloning`` on, and ``tests/faultproxy.py``
(a real TCP relay) to take a replica down and bring it back.

The replicas are this gateway, which stores uploads as vllm-omni does (per
server, ``POST /v1/audio/voices`` multipart with vllm-omni's field names)
but cannot clone with its synthetic engine: a segment routed to a replica
holding an uploaded voice is answered with that replica's own refusal
("cannot clone"), which is how these tests tell it reached a holder, while
a replica without the voice would answer ``unknown voice``.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.engines.pool.routing import ReplicaState
from gateway.engines.upstream.engine import UpstreamEngine
from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as settings_for
from tests.faultproxy import FaultProxy, Faults
from tests.helpers import ServeProcess, open_ws, send, serve_process
from tests.http.test_http_voices import tone

AUDIO = tone(2.0)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServeProcess]]:
    """Two ordinary replicas, and a third that refuses every upload from the
    front (413: its form limit of 2 parts is below the 3 an upload sends)."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                serve_process(tmp_path_factory.mktemp(f"voices{i}"), engine="synthetic", **extra)
            )
            for i, extra in enumerate([{}, {}, {"max_form_parts": 2}])
        ]


@contextmanager
def front(urls: list[str], data_dir: Path, **upstream: Any) -> Iterator[RunningServer]:
    config = {
        "urls": urls,
        "health_path": "/healthz",
        "ready_paths": ["/v1/audio/voices"],
        "probe_interval_s": 0.2,
        "cooldown_s": 1.0,
        "send_sample_rate": True,
        "cloning": True,
        **upstream,
    }
    settings = settings_for(engine="upstream", upstream=config, data_dir=str(data_dir))
    with run_server(settings, None) as server:
        yield server


def engine_of(server: RunningServer) -> UpstreamEngine:
    engine = server.state.engine
    assert isinstance(engine, UpstreamEngine)
    return engine


async def upload(base: str, name: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(
            base + "/v1/audio/voices",
            data={"name": name, "consent": "true", "ref_text": "A tone."},
            files={"audio": ("a.wav", AUDIO, "audio/wav")},
        )


async def delete(base: str, name: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.delete(f"{base}/v1/audio/voices/{name}")


async def listing(base: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        doc: dict[str, Any] = (await client.get(base + "/v1/audio/voices")).json()
        return doc


async def held(base: str) -> set[str]:
    """The uploaded voices a server lists."""
    return {v["name"] for v in (await listing(base))["uploaded_voices"]}


async def speech(base: str, voice: str) -> httpx.Response:
    body = {"input": "Hello there.", "voice": voice, "response_format": "pcm", "sample_rate": 22050}
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(base + "/v1/audio/speech", json=body)


async def until(check: Callable[[], Awaitable[bool]], limit_s: float = 10.0) -> None:
    async with asyncio.timeout(limit_s):
        while not await check():
            await asyncio.sleep(0.05)


async def state_is(gw: RunningServer, index: int, state: ReplicaState) -> None:
    pool = engine_of(gw).client.pool

    async def reached() -> bool:
        return pool.replicas[index].state is state

    await until(reached)


async def ask(ws: Any, **message: Any) -> dict[str, Any]:
    await send(ws, **message)
    while True:
        raw = await ws.recv()
        if isinstance(raw, str):
            event: dict[str, Any] = json.loads(raw)
            return event


async def test_uploads_and_deletions_reach_every_replica(
    replicas: list[ServeProcess], tmp_path: Path
) -> None:
    a, b, _ = replicas
    with front([a.base, b.base], tmp_path) as gw:
        await state_is(gw, 0, ReplicaState.READY)
        await state_is(gw, 1, ReplicaState.READY)
        added = await upload(gw.http, "Fanned")
        assert added.status_code == 200, added.text
        assert added.json()["voice"]["speakable"] is True
        for replica in (a, b):
            assert "Fanned" in await held(replica.base)
        # listed once by the front, as uploaded (not also as a replica's voice)
        doc = await listing(gw.http)
        assert [v["type"] for v in doc["data"] if v["name"] == "Fanned"] == ["uploaded"]
        assert "Fanned" in doc["voices"]  # speakable names
        # the WebSocket's voice.add and voice.remove take the same way
        async with await open_ws(gw.ws_url) as ws:
            await ws.recv()
            answer = await ask(
                ws,
                type="voice.add",
                name="Socket voice",
                audio=base64.b64encode(AUDIO).decode(),
                consent=True,
            )
            assert answer["type"] == "voice.add.result", answer
            for replica in (a, b):
                assert "Socket voice" in await held(replica.base)
            answer = await ask(ws, type="voice.remove", name="Socket voice")
            assert answer["type"] == "voice.remove.result", answer
        for replica in (a, b):
            assert "Socket voice" not in await held(replica.base)
        removed = await delete(gw.http, "Fanned")
        assert removed.status_code == 200, removed.text
        for replica in (a, b):
            assert "Fanned" not in await held(replica.base)
        assert "Fanned" not in await held(gw.http)


async def test_a_replica_that_returns_is_reconciled(
    replicas: list[ServeProcess], tmp_path: Path
) -> None:
    a, b, _ = replicas
    proxy = FaultProxy(a.port)
    try:
        with front([proxy.url, b.base], tmp_path) as gw:
            await state_is(gw, 0, ReplicaState.READY)
            proxy.refuse()  # replica a goes down
            await state_is(gw, 0, ReplicaState.UNREADY)
            assert (await upload(gw.http, "Comeback")).status_code == 200
            assert "Comeback" in await held(b.base)
            assert "Comeback" not in await held(a.base)
            proxy.resume()  # it returns: reconciled

            async def a_has_it() -> bool:
                return "Comeback" in await held(a.base)

            await until(a_has_it)
            # a deletion while it is down reaches it when it returns
            proxy.refuse()
            await state_is(gw, 0, ReplicaState.UNREADY)
            assert (await delete(gw.http, "Comeback")).status_code == 200
            assert "Comeback" not in await held(b.base)
            assert "Comeback" in await held(a.base)
            proxy.resume()

            async def a_lost_it() -> bool:
                return "Comeback" not in await held(a.base)

            await until(a_lost_it)
            # a replica that lost a voice (a restart) is given it again
            assert (await upload(gw.http, "Keeper")).status_code == 200
            assert (await delete(b.base, "Keeper")).status_code == 200

            async def b_has_it() -> bool:
                return "Keeper" in await held(b.base)

            await until(b_has_it)
            assert "Keeper" in await held(a.base)
            assert (await delete(gw.http, "Keeper")).status_code == 200
    finally:
        proxy.close()


async def test_a_voice_only_some_replicas_hold_is_routed_to_those(
    replicas: list[ServeProcess], tmp_path: Path
) -> None:
    a, _, refusing = replicas
    with front([refusing.base, a.base], tmp_path) as gw:
        await state_is(gw, 0, ReplicaState.READY)
        await state_is(gw, 1, ReplicaState.READY)
        assert (await upload(gw.http, "Partial")).status_code == 200
        assert "Partial" not in await held(refusing.base)  # it refused the upload
        assert "Partial" in await held(a.base)
        pool = engine_of(gw).client.pool
        before = [r.requests for r in pool.replicas]
        for _ in range(4):
            answer = await speech(gw.http, "Partial")
            # the holder's own answer: its synthetic engine cannot clone
            assert answer.status_code >= 400
            assert "cannot clone" in answer.text, answer.text
        after = [r.requests for r in pool.replicas]
        assert [after[0] - before[0], after[1] - before[1]] == [0, 4]
        # a voice both hold still goes to both
        for _ in range(4):
            assert (await speech(gw.http, "tone")).status_code == 200
        final = [r.requests for r in pool.replicas]
        assert final[0] > after[0] and final[1] > after[1]
        assert all(r.state is ReplicaState.READY for r in pool.replicas)
        assert (await delete(gw.http, "Partial")).status_code == 200


async def test_an_upload_no_replica_takes_is_refused_and_not_kept(
    replicas: list[ServeProcess], tmp_path: Path
) -> None:
    refusing = replicas[2]
    with front([refusing.base], tmp_path) as gw:
        await state_is(gw, 0, ReplicaState.READY)
        refused = await upload(gw.http, "Nowhere")
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_config"
        assert "refused the voice" in error["message"]
        assert "127.0.0.1" not in error["message"]  # no replica address
        assert "Nowhere" not in await held(gw.http)
        assert "Nowhere" not in await held(refusing.base)


async def test_voices_stored_before_a_restart_reach_a_new_replica(
    replicas: list[ServeProcess], tmp_path: Path
) -> None:
    """The gateway's store is the truth: a gateway started on it (a restart,
    or a replica added to ``urls``) gives every replica what it lacks."""
    a, b, _ = replicas
    with front([a.base], tmp_path) as gw:
        await state_is(gw, 0, ReplicaState.READY)
        assert (await upload(gw.http, "Persisted")).status_code == 200
    assert "Persisted" not in await held(b.base)
    with front([a.base, b.base], tmp_path) as gw:

        async def b_has_it() -> bool:
            return "Persisted" in await held(b.base)

        await until(b_has_it)
        assert (await delete(gw.http, "Persisted")).status_code == 200
        for replica in (a, b):
            assert "Persisted" not in await held(replica.base)


async def test_a_slow_upload_never_holds_up_the_sessions_other_messages(
    replicas: list[ServeProcess], tmp_path: Path
) -> None:
    """An upload copied to a slow replica (1.5 s at the proxy) is answered
    beside the session's messages: a ``ping`` sent after it is answered
    first; a ``session.config`` naming the new voice waits for it."""
    slow = FaultProxy(replicas[0].port)
    # no probes: they would queue behind the delay too
    with front([slow.url], tmp_path, health_path="", ready_paths=[], native_rate=22050) as gw:
        await state_is(gw, 0, ReplicaState.READY)
        slow.faults = Faults(delay_s=1.5)
        async with await open_ws(gw.ws_url) as ws:
            await ws.recv()
            audio = base64.b64encode(AUDIO).decode()
            await send(ws, type="voice.add", name="Slowpoke", audio=audio, consent=True)
            await send(ws, type="ping", id="behind")
            await send(ws, type="session.config", voice="Slowpoke")
            order = []
            while len(order) < 3:
                raw = await ws.recv()
                if isinstance(raw, str):
                    order.append(json.loads(raw)["type"])
            assert order == ["pong", "voice.add.result", "session.updated"], order
    slow.close()
