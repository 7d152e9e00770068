"""What voice-agent hosts need from the gateway, on a real server: protocol
ping frames keep a quiet session open, and agent API keys are limited per
key instead of per address."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.engines.base import Engine
from tests import conftest
from tests.conftest import RunningServer, run_server
from tests.helpers import send

CONFIG = {"response_format": "pcm", "stream_audio": True, "frame_ms": 20}


@pytest.fixture
def agent_server(synthetic_engine: Engine) -> Iterator[RunningServer]:
    settings = conftest.test_settings(
        engine="synthetic",
        idle_timeout_s=1.5,
        api_keys=["browser-key"],
        agent_api_keys=["agent-key"],
        max_sessions_per_client=1,
        max_sessions_per_agent_key=3,
    )
    with run_server(settings, synthetic_engine) as server:
        yield server


async def _open(url: str, key: str) -> ClientConnection:
    # no automatic pings: the test decides when pings are sent
    ws = await connect(
        url, additional_headers={"Authorization": f"Bearer {key}"}, ping_interval=None
    )
    return ws


async def _close_code(ws: ClientConnection, limit_s: float) -> tuple[list[dict[str, object]], int]:
    events: list[dict[str, object]] = []
    async with asyncio.timeout(limit_s):
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                raw = await ws.recv()
                if isinstance(raw, str):
                    events.append(json.loads(raw))
    assert closed.value.rcvd is not None
    return events, closed.value.rcvd.code


async def test_ping_frames_keep_a_quiet_session_open(agent_server: RunningServer) -> None:
    ws = await _open(agent_server.ws_url, "agent-key")
    assert json.loads(await ws.recv())["type"] == "session.created"
    await send(ws, type="session.config", **CONFIG)
    assert json.loads(await ws.recv())["type"] == "session.updated"
    # four idle periods with no client message, only RFC 6455 ping frames
    for _ in range(24):
        pong = await ws.ping()
        async with asyncio.timeout(5):
            await pong
        await asyncio.sleep(0.25)
    assert len(agent_server.state.live_sessions) == 1, "closed although pings arrived"
    # still a working session: a turn is spoken after the quiet period
    await send(ws, type="input.text", text="Still here. ", context_id="t2")
    await send(ws, type="input.done", context_id="t2")
    kinds: list[str] = []
    async with asyncio.timeout(30):
        while "session.done" not in kinds:
            raw = await ws.recv()
            if isinstance(raw, str):
                kinds.append(json.loads(raw)["type"])
    assert "audio.start" in kinds
    # the pings stop: the idle timeout applies again
    events, code = await _close_code(ws, limit_s=15)
    assert code == 4002
    assert events[-1]["type"] == "error" and events[-1]["code"] == "timeout"


async def test_agent_key_is_limited_per_key_not_per_address(agent_server: RunningServer) -> None:
    url = agent_server.ws_url
    agents = [await _open(url, "agent-key") for _ in range(3)]
    browser = await _open(url, "browser-key")
    try:
        for ws in [*agents, browser]:
            assert json.loads(await ws.recv())["type"] == "session.created"
        # the address already holds four sessions; its own limit is one, and
        # the agent sessions do not count against it (nor it against them)
        assert agent_server.state.sessions == 4
        extra_browser = await _open(url, "browser-key")
        events, code = await _close_code(extra_browser, limit_s=10)
        assert events[0]["code"] == "busy" and "address" in str(events[0]["message"])
        assert code == 1013
        extra_agent = await _open(url, "agent-key")
        events, code = await _close_code(extra_agent, limit_s=10)
        assert events[0]["code"] == "busy" and "agent key" in str(events[0]["message"])
        assert code == 1013
        # an agent key is still a key: without one the server refuses
        anonymous = await connect(url, ping_interval=None)
        events, code = await _close_code(anonymous, limit_s=10)
        assert events[0]["code"] == "unauthorized" and code == 1008
    finally:
        for ws in [*agents, browser]:
            await ws.close()
