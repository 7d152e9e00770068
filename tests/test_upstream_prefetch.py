"""Prefetched upstream requests are counted like any other: against the
replica's concurrency cap (``upstream.max_per_replica``) and as active
streams of their session (``max_streams_per_session``).

Real components only: a ``python -m gateway serve`` process (synthetic
engine) as the replica, a gateway in ``upstream`` mode in front of it (real
uvicorn), a real WebSocket client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.engines.upstream.engine import UpstreamEngine
from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as settings_for
from tests.helpers import ServeProcess, Transcript, open_ws, recv_until, send, serve_process

TWO = "The lighthouse stood on the cliff. Its lamp turned over the dark water."
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
STREAM = {"response_format": "pcm", "stream_audio": True, "frame_ms": 20}
PASSIVE = {"health_path": "", "ready_paths": [], "native_rate": 22050, "voices": ["tone"]}


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with serve_process(tmp_path_factory.mktemp("prefetch"), engine="synthetic") as server:
        yield server


@contextmanager
def front(replica: ServeProcess, data_dir: Path, **settings: Any) -> Iterator[RunningServer]:
    upstream = {"urls": [replica.base], "send_sample_rate": True, **PASSIVE}
    upstream.update(settings.pop("upstream", {}))
    config = settings_for(engine="upstream", upstream=upstream, data_dir=str(data_dir), **settings)
    with run_server(config, None) as server:
        yield server


def engine_of(server: RunningServer) -> UpstreamEngine:
    engine = server.state.engine
    assert isinstance(engine, UpstreamEngine)
    return engine


async def until(check: Callable[[], bool], limit_s: float = 5.0) -> None:
    async with asyncio.timeout(limit_s):
        while not check():
            await asyncio.sleep(0.002)


@pytest.mark.parametrize("cap", [1, 2])
async def test_prefetched_requests_count_against_the_replica_cap(
    replica: ServeProcess, tmp_path: Path, cap: int
) -> None:
    """Three segments, the next always requested while one streams: at most
    ``cap`` requests at the replica at once, and every segment still spoken."""
    with front(replica, tmp_path, upstream={"max_per_replica": cap}) as gw:
        slot = engine_of(gw).client.pool.replicas[0]
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, slot.outstanding)
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        try:
            async with await open_ws(gw.ws_url) as ws:
                await ws.recv()
                await send(ws, type="session.config", split_granularity="sentence", **STREAM)
                await send(ws, type="input.text", text=f"{TWO} {SENTENCE}")
                await send(ws, type="input.done")
                t = await recv_until(ws, Transcript())
        finally:
            watcher.cancel()
        assert not t.of("error") and len(t.of("audio.done")) == 3
        assert most == cap  # the prefetch reached the cap and never passed it
        assert slot.requests == 3 and slot.outstanding == 0


async def test_a_prefetched_request_counts_as_an_active_stream_of_its_session(
    replica: ServeProcess, tmp_path: Path
) -> None:
    """Context ``a`` speaks while ``b``'s segment is already requested from
    the replica: both count towards the session's share (2), so a third
    context waits (it is never refused: the share delays) and is not
    requested; a cancel ends every request at once."""
    with front(replica, tmp_path, max_streams_per_session=2) as gw:
        slot = engine_of(gw).client.pool.replicas[0]
        admission = gw.state.admission
        async with await open_ws(gw.ws_url) as ws:
            await ws.recv()
            await send(ws, type="session.config", **STREAM)
            for cid, text in (("a", SENTENCE), ("b", "Hello there.")):
                await send(ws, type="input.text", text=text, context_id=cid)
                await send(ws, type="input.done", context_id=cid)
            # b's request is in flight while a's audio streams (raw framing:
            # b is spoken after a), and b's utterance holds one of the share
            await until(lambda: slot.outstanding == 2)
            assert admission.active == 1  # one session admitted
            await send(ws, type="input.text", text="A third one.", context_id="c")
            await send(ws, type="input.done", context_id="c")
            await send(ws, type="ping", id="sync")
            t = Transcript()
            async with asyncio.timeout(10):
                while not t.of("pong"):
                    raw = await ws.recv()
                    t.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
            assert not t.of("error")  # accepted, waiting for the session's share
            assert slot.outstanding == 2 and slot.requests == 2  # c not requested yet
            # barge-in: the playing and the prefetched request both end
            await send(ws, type="cancel", context_id="*")
            await until(lambda: slot.outstanding == 0)
            assert admission.active == 1  # the session keeps its admission
