"""Resume across a tier of real ``python -m gateway serve`` processes
(protocol 2.2.0): a token names the gateway that issued it, another gateway
refuses it with ``resume_elsewhere`` naming that gateway, and a drain ends
the suspended sessions and refuses their resumes.

The synthetic engine is used: this is about routing and lifecycle, not
speech, and it starts in about a second.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from tests.helpers import ServeProcess, Transcript, open_ws, recv_until, send, serve_process

CONFIG = {"response_format": "pcm", "stream_audio": True, "frame_ms": 20, "framing": "tagged"}


async def _opened(url: str) -> tuple[ClientConnection, dict[str, Any]]:
    ws = await open_ws(url)
    created = json.loads(await ws.recv())
    await send(ws, type="session.config", **CONFIG)
    assert json.loads(await ws.recv())["type"] == "session.updated"
    return ws, created


async def _resume(url: str, token: str) -> tuple[ClientConnection, dict[str, Any]]:
    ws = await open_ws(url)
    assert json.loads(await ws.recv())["type"] == "session.created"
    await send(ws, type="session.resume", resume_token=token, events=1)
    return ws, json.loads(await ws.recv())


async def _close_code(ws: ClientConnection) -> int | None:
    with pytest.raises(ConnectionClosed) as closed:
        await ws.recv()
    return closed.value.rcvd.code if closed.value.rcvd else None


def _suspended(server: ServeProcess) -> float:
    text = httpx.get(server.base + "/metrics", timeout=10).text
    found = re.search(r"^gateway_sessions_suspended (\S+)$", text, re.MULTILINE)
    assert found is not None
    return float(found.group(1))


async def _until_suspended(server: ServeProcess, count: int) -> None:
    async with asyncio.timeout(10):
        while _suspended(server) != count:
            await asyncio.sleep(0.05)


def test_a_resume_on_another_gateway_names_the_one_to_route_to(tmp_path: Path) -> None:
    settings: dict[str, Any] = {"engine": "synthetic", "resume_window_s": 30}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        serve_process(tmp_path / "a", gateway_id="gw-a", **settings) as gw_a,
        serve_process(tmp_path / "b", gateway_id="gw-b", **settings) as gw_b,
    ):

        async def scenario() -> None:
            ws, created = await _opened(gw_a.ws_url)
            token = created["resume_token"]
            prefix, secret = token.split(".")
            assert prefix == "gw-a" and len(secret) == 43
            assert re.fullmatch(r"[A-Za-z0-9_.-]+", token)  # URL-safe as it is
            ws.transport.abort()
            await _until_suspended(gw_a, 1)
            # the client puts the prefix in the URL for the proxy; the
            # gateway ignores the parameter
            async with asyncio.timeout(30):
                wrong, error = await _resume(f"{gw_b.ws_url}?resume={prefix}", token)
                assert (error["type"], error["code"], error["fatal"]) == (
                    "error",
                    "resume_elsewhere",
                    True,
                )
                assert "'gw-a'" in error["message"] and "'gw-b'" in error["message"]
                assert "127.0.0.1" not in error["message"]
                assert str(gw_a.port) not in error["message"]  # an id, never an address
                assert await _close_code(wrong) == 1008
                # gw-b's refusal left the session on gw-a as it was
                assert _suspended(gw_a) == 1
                right, again = await _resume(f"{gw_a.ws_url}?resume={prefix}", token)
                assert again["type"] == "session.created"
                assert again["session_id"] == created["session_id"]
                assert again["resume_token"].startswith("gw-a.")
                assert json.loads(await right.recv())["type"] == "session.resumed"
                await send(right, type="input.text", text="Hello there.")
                await send(right, type="input.done")
                spoken = await recv_until(right, Transcript())
                assert spoken.binary and spoken.of("session.done")[0]["cancelled"] is False
                await right.close()

        asyncio.run(scenario())
        text = httpx.get(gw_b.base + "/metrics", timeout=10).text
    assert 'gateway_resumes_refused_total{reason="resume_elsewhere"} 1.0' in text


def test_a_drain_ends_suspended_sessions_and_refuses_their_resume(tmp_path: Path) -> None:
    """docs/protocol.md: a suspended session ends when the server begins to
    drain, and a resume during the drain is refused like any new connection
    (``busy``, 1013)."""
    with serve_process(
        tmp_path, engine="synthetic", resume_window_s=30, drain_timeout_s=4
    ) as server:
        outcome: dict[str, Any] = {}

        async def scenario() -> None:
            # a live session that keeps the drain going (input.done: spoken
            # for up to drain_timeout_s), and a suspended one
            live, _ = await _opened(server.ws_url)
            await send(live, type="input.text", text="A long one. " * 20)
            await send(live, type="input.done")
            while not isinstance(await live.recv(), bytes):
                pass
            gone, _ = await _opened(server.ws_url)
            gone.transport.abort()
            await _until_suspended(server, 1)
            server.proc.send_signal(signal.SIGTERM)
            async with httpx.AsyncClient() as http:
                while (await http.get(f"{server.base}/readyz")).status_code != 503:
                    await asyncio.sleep(0.01)
                # the live session drains for drain_timeout_s (4 s): within
                # it, the suspended one has ended and the live one has not
                async with asyncio.timeout(3):
                    while True:
                        metrics = (await http.get(f"{server.base}/metrics")).text
                        counts = [
                            float(re.findall(rf"^gateway_sessions_{name} (\S+)$", metrics, re.M)[0])
                            for name in ("suspended", "active")
                        ]
                        if counts == [0, 1]:
                            break
                        await asyncio.sleep(0.05)
            # a client that comes back to resume: its connection's first
            # message is the refusal, where session.created would be
            ws = await open_ws(server.ws_url)
            outcome["refused"] = json.loads(await ws.recv())
            outcome["code"] = await _close_code(ws)
            try:
                async with asyncio.timeout(20):
                    while True:
                        await live.recv()
            except ConnectionClosed:
                pass

        asyncio.run(scenario())
        assert server.proc.wait(timeout=20) == 0
    assert outcome["refused"]["code"] == "busy" and outcome["code"] == 1013
