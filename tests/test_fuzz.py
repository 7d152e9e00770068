"""Property-based fuzz of message sequences and malformed frames on a real
server: any input is accepted or rejected with a documented error or close
code, the server stays up, a concurrent session is unaffected, and the debug
gauges (live asyncio tasks, engine jobs) return to their baseline, also after
50 abrupt disconnects mid-utterance.

The synthetic engine keeps the fuzz cheap (this is about the protocol layer,
not speech); ``max_message_bytes`` is lowered so oversized frames are small.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gateway import protocol
from gateway.engines.base import Engine
from gateway.errors import ErrorCode
from gateway.ws.endpoint import Connection
from tests import conftest
from tests.conftest import RunningServer, run_server
from tests.helpers import Transcript, open_ws, recv_until, send

MAX_MESSAGE = 4096
SERVER_TYPES = {
    "session.created", "session.updated", "audio.start", "alignment", "audio.done",
    "audio.cancelled", "session.done", "pong", "error", "warning", "audio.chunk",
    "voice.list.result", "voice.add.result", "voice.remove.result",
}  # fmt: skip
CLOSE_CODES = {1000, 1007, 1008, 1009, 1011, 1013, 4001, 4002, 4008}
ERROR_CODES = {str(code) for code in ErrorCode}
CLIENT_TYPES = ["session.config", "input.text", "input.flush", "input.done", "cancel",
                "playback", "ping", "session.close", "voice.list", "voice.add",
                "voice.remove", "bogus", ""]  # fmt: skip
WITNESS_TEXT = "The witness speaks calmly."
STREAM = {"response_format": "pcm", "stream_audio": True, "frame_ms": 20}


@pytest.fixture(scope="module")
def fuzz_server(synthetic_engine: Engine) -> Iterator[RunningServer]:
    overrides = {
        "engine": "synthetic",
        "max_message_bytes": MAX_MESSAGE,
        "max_messages_per_second": 10_000,
        "max_connections_per_minute": 100_000,
        "max_sessions_per_client": 64,
    }
    with run_server(conftest.test_settings(**overrides), synthetic_engine) as server:
        yield server


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
contexts = st.sampled_from([None, "a", "b", "*", ""])
configs = st.sampled_from(
    [
        STREAM,
        {**STREAM, "flow_control": "ack", "max_lead_ms": 100},
        {**STREAM, "flow_control": "realtime", "framing": "tagged"},
        {"response_format": "wav"},
        {"speed": 9},
        {"voice": "nobody"},
        {"bogus": 1},
        {"flow_control": "ack"},
        {"split_granularity": "none", "timestamps": True},
    ]
)
valid_messages = st.one_of(
    st.builds(lambda t, c: {"type": "input.text", "text": t, "context_id": c},
              st.text(max_size=40), contexts),
    st.builds(lambda c: {"type": "input.flush", "context_id": c}, contexts),
    st.builds(lambda c: {"type": "input.done", "context_id": c}, contexts),
    st.builds(lambda c: {"type": "cancel", "context_id": c}, contexts),
    st.builds(lambda p, c: {"type": "playback", "played_ms": p, "context_id": c},
              st.floats(0, 1e5), contexts),
    st.builds(lambda i: {"type": "ping", "id": i}, st.integers() | st.text(max_size=5)),
    st.builds(lambda c: {"type": "session.config", **c}, configs),
    st.builds(lambda i: {"type": "voice.list", "request_id": i}, st.integers() | st.none()),
    # never a real voice: "fuzz " names only, random bytes as audio (always refused)
    st.builds(lambda n: {"type": "voice.remove", "name": "fuzz " + n}, st.text(max_size=8)),
    st.builds(lambda n, a, c: {"type": "voice.add", "name": "fuzz " + n,
                               "audio": base64.b64encode(a).decode(), "consent": c},
              st.text(max_size=8), st.binary(max_size=64), st.booleans()),
)  # fmt: skip
wrong_types = st.builds(
    lambda t, k, v: {"type": t, k: v},
    st.sampled_from(CLIENT_TYPES),
    st.sampled_from(["text", "context_id", "played_ms", "speed", "id", "voice", "type"]),
    json_values,
)
frames = st.one_of(
    valid_messages.map(json.dumps),
    wrong_types.map(json.dumps),
    json_values.map(json.dumps),  # non-object JSON, mostly
    st.text(max_size=30),  # not JSON, mostly
    st.binary(max_size=64),  # binary from the client
    st.just(["\\ud83d", "\\ude00 there. "]),  # a surrogate pair split across messages
)
endings = st.sampled_from(["close", "abort", "oversized", "bad_utf8", "leave"])


async def _send_frame(ws: ClientConnection, frame: str | bytes | list[str]) -> None:
    if isinstance(frame, list):
        for half in frame:
            await ws.send('{"type": "input.text", "text": "' + half + '"}')
    else:
        await ws.send(frame)


async def _drain(ws: ClientConnection, quiet_s: float) -> tuple[list[Any], int | None]:
    items: list[Any] = []
    try:
        while True:
            items.append(await asyncio.wait_for(ws.recv(), quiet_s))
    except TimeoutError:
        return items, None
    except ConnectionClosed as closed:
        return items, closed.rcvd.code if closed.rcvd else 1006


def _check_messages(items: list[Any]) -> None:
    for item in items:
        if isinstance(item, bytes):
            continue
        event = json.loads(item)
        assert event["type"] in SERVER_TYPES, event
        if event["type"] == "error":
            assert event["code"] in ERROR_CODES, event


async def _witness(url: str) -> None:
    async with await open_ws(url) as ws:
        await ws.recv()
        await send(ws, type="session.config", **STREAM)
        await send(ws, type="input.text", text=WITNESS_TEXT)
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript(), limit_s=20)
        assert not t.of("error")
        done = t.of("session.done")[0]
        assert done["cancelled"] is False
        expected_ms = len(WITNESS_TEXT) * 60  # the synthetic engine's pace
        assert abs(done["metrics"]["audio_ms"] - expected_ms) <= 20


async def _fuzz_one(url: str, sequence: list[Any], ending: str) -> None:
    ws = await open_ws(url)
    try:
        await _fuzz_session(ws, sequence, ending)
    finally:
        # whatever was found, the connection goes: a failed example must not
        # leave a session open for the next one (or the gauge test) to see
        ws.transport.abort()


async def _fuzz_session(ws: ClientConnection, sequence: list[Any], ending: str) -> None:
    try:
        created = json.loads(await ws.recv())
        assert created["type"] == "session.created"
        for frame in sequence:
            await _send_frame(ws, frame)
        if ending == "close":
            await send(ws, type="session.close")
        elif ending == "oversized":
            await ws.send(json.dumps({"type": "input.text", "text": "x" * MAX_MESSAGE}))
        elif ending == "bad_utf8":
            await ws.send(b'{"type": "ping", "id": "\xff\xfe"}', text=True)
        elif ending == "abort":
            ws.transport.abort()
            return
    except ConnectionClosed:
        pass  # a fatal error (e.g. a rejected first config) closed it first
    items, code = await _drain(ws, 0.3)
    _check_messages(items)
    if code is not None:
        assert code in CLOSE_CODES
    # 1008: a fatal config error came first; 1000: a valid session.close in
    # the sequence closed the session before the bad last frame
    if ending == "oversized" and code is not None:
        assert code in {1009, 1008, 1000}
    if ending == "bad_utf8" and code is not None:
        assert code in {1007, 1008, 1009, 1000}
    await ws.close()


def _gauge(server: RunningServer, name: str) -> float:
    text = httpx.get(f"{server.http}/metrics").text
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match is not None
    return float(match.group(1))


async def _back_to_baseline(server: RunningServer, engine: Engine, tasks: float) -> None:
    def state() -> tuple[int, int, int, float]:
        s = server.state
        tasks_now = _gauge(server, "gateway_live_tasks")
        return s.sessions, s.admission.active, engine.live_jobs(), tasks_now

    try:
        async with asyncio.timeout(15):
            while state() != (0, 0, 0, tasks):
                await asyncio.sleep(0.1)
    except TimeoutError:
        stuck = [
            (
                x.session.state,
                [(st.name, st.task, st.current, len(st.queue)) for st in x.session.streams()],
            )
            for x in server.state.live_sessions
            if isinstance(x, Connection)
        ]
        # the engine is shared with other modules' servers: name the jobs, so a
        # job leaked elsewhere points at its test
        live = getattr(engine, "_live", None)
        left = live.snapshot() if live is not None else []
        jobs = [(j.request.label, j.text[:40], j.cancelled) for j in left]
        raise AssertionError(
            f"(sessions, streams, jobs, tasks) = {state()}; {stuck}; live jobs {jobs}"
        ) from None


@pytest.fixture(scope="module")
def baseline(fuzz_server: RunningServer) -> float:
    asyncio.run(_witness(fuzz_server.ws_url))
    return _gauge(fuzz_server, "gateway_live_tasks")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(sequence=st.lists(frames, max_size=10), ending=endings)
def test_fuzz_sequences_and_malformed_frames(
    fuzz_server: RunningServer, baseline: float, sequence: list[Any], ending: str
) -> None:
    async def run() -> None:
        await asyncio.gather(_fuzz_one(fuzz_server.ws_url, sequence, ending),
                             _witness(fuzz_server.ws_url))  # fmt: skip

    asyncio.run(run())


def test_gauges_back_to_baseline_after_fuzz_and_abrupt_disconnects(
    fuzz_server: RunningServer, synthetic_engine: Engine, baseline: float
) -> None:
    async def run() -> None:
        await _back_to_baseline(fuzz_server, synthetic_engine, baseline)
        for i in range(50):
            ws = await open_ws(fuzz_server.ws_url)
            await ws.recv()
            config = {**STREAM, "flow_control": "realtime"} if i % 2 else STREAM
            await send(ws, type="session.config", **config)
            await send(ws, type="input.text", text="A long sentence that is cut. " * 5)
            if i % 3:
                await send(ws, type="input.done")
            while not isinstance(await ws.recv(), bytes):
                pass
            ws.transport.abort()  # mid-utterance, no close handshake
        await _back_to_baseline(fuzz_server, synthetic_engine, baseline)
        await _witness(fuzz_server.ws_url)  # still serving

    asyncio.run(run())
    assert protocol.PROTOCOL_VERSION  # the server module imported cleanly
