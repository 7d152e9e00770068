"""Automatic admission on a real server (``max_active_streams = 0``, the
default): the slots come from the start's measurement of the engine and
follow the measured cost of speech (``gateway.flow.capacity``; the
controller's own table is tests/flow/test_capacity.py)."""

from __future__ import annotations

import asyncio
import math
import os
import re
from collections.abc import Callable

import httpx
import pytest

from gateway.engines.base import Engine
from gateway.engines.registry import create_engine
from gateway.flow.capacity import CPU_SHARE
from gateway.state import FIXED_ACTIVE_STREAMS
from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as make_settings
from tests.helpers import Transcript, open_ws, recv_until, send

PARAGRAPH = (
    "The first option is cheaper, and it leaves on Friday morning. The second one is"
    " faster, but it costs a little more, and it leaves on Saturday. Both include"
    " breakfast, and both can be cancelled until the day before you travel."
)


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


def _gauge(server: RunningServer, name: str) -> float:
    text = httpx.get(server.http + "/metrics", timeout=10).text
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, f"no {name}"
    return float(match.group(1))


async def test_the_door_reserves_the_measured_cost_of_speech() -> None:
    """The door's measure on a real server: once a conversation has spoken,
    the CPU seconds a second of speech costs is a number, and capacity is
    the reserved half of the cores over it.  One thread per stage, so every
    work item counts (an item run on several threads would not)."""
    settings = make_settings(
        max_active_streams=0,
        piper={"deterministic": False, "acoustic_threads": 1, "vocoder_threads": 1},
    )
    engine = create_engine(settings)
    await engine.start()
    try:
        with run_server(settings, engine) as server:
            assert math.isnan(_gauge(server, "gateway_door_cost_seconds"))
            async with await open_ws(server.ws_url) as ws:
                await ws.recv()
                await send(ws, type="session.config", voice="joe")
                await ws.recv()
                await send(ws, type="input.text", text=PARAGRAPH)
                await send(ws, type="input.done")
                t = await recv_until(ws, Transcript(), limit_s=60)
            assert not t.of("error")
            # the door reads the engine every 0.25 s; the last readings of the
            # reply may still move the cost: read it once it holds for 0.6 s
            cost, before = math.nan, math.inf
            async with asyncio.timeout(15):
                while math.isnan(cost) or cost != before:
                    before = cost
                    await asyncio.sleep(0.6)
                    cost = _gauge(server, "gateway_door_cost_seconds")
            # faster than real time on one core, and not free
            assert 0.001 < cost < 1.0
            budget = _gauge(server, "gateway_door_budget_cores")
            assert budget == pytest.approx(len(os.sched_getaffinity(0)) * CPU_SHARE)
            # the reservation, less the safety cut if this machine ran late
            door = server.state.door
            assert door is not None and 0 < door.trim <= 1
            capacity = _gauge(server, "gateway_door_capacity_streams")
            assert capacity == pytest.approx(max(1.0, door.trim * budget / cost), rel=0.01)
    finally:
        await engine.aclose()
