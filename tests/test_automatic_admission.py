"""Automatic admission on a real server (``max_active_streams = 0``, the
default): the slots come from the start's measurement of the engine and
follow its lateness (``gateway.flow.capacity``; the controller's own table
is tests/flow/test_capacity.py)."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx

from gateway.engines.base import Engine
from gateway.state import FIXED_ACTIVE_STREAMS
from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as make_settings
from tests.helpers import Transcript, open_ws, recv_until, send


def _ws_limit(server: RunningServer) -> float:
    text = httpx.get(server.http + "/metrics", timeout=10).text
    match = re.search(r'gateway_admission_slots_limit\{surface="ws"\} (\S+)', text)
    assert match, "no ws slots gauge"
    return float(match.group(1))


async def test_the_slots_are_measured_at_start_and_serve(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(max_active_streams=0, max_sessions=3)
    measured = server.state.measured_streams
    assert measured is not None and measured > 0.5  # Piper is faster than real time here
    limit = server.state.admission.limit
    assert 1 <= limit <= 3 and _ws_limit(server) == limit
    assert server.state.settings.max_active_streams == 0
    async with await open_ws(server.ws_url) as ws:
        await ws.recv()
        await send(ws, type="session.config", voice="joe")
        await ws.recv()
        await send(ws, type="input.text", text="Measured, then served.")
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript(), limit_s=30)
    assert not t.of("error") and sum(map(len, t.binary)) > 0
    assert server.state.admission.active == 0


def test_an_engine_without_a_load_signal_keeps_fixed_slots(
    synthetic_engine: Engine,
) -> None:
    settings = make_settings(engine="synthetic", max_active_streams=0)
    with run_server(settings, synthetic_engine) as server:
        assert server.state.admission.limit == FIXED_ACTIVE_STREAMS
        assert _ws_limit(server) == FIXED_ACTIVE_STREAMS
    assert server.state.measured_streams is None
