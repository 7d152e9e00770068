"""Limits, admission, authentication and Origin on a real server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from tests.conftest import RunningServer
from tests.helpers import Transcript, open_ws, recv_until, send, serve_process

STREAM = {"response_format": "pcm", "stream_audio": True, "frame_ms": 20}


async def _refusal(url: str, **kwargs: object) -> tuple[dict[str, object], int]:
    async with await open_ws(url, **kwargs) as ws:  # type: ignore[arg-type]
        error = json.loads(await ws.recv())
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None
        return error, closed.value.rcvd.code


async def test_sessions_per_client(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(max_sessions_per_client=2)
    first = await open_ws(server.ws_url)
    second = await open_ws(server.ws_url)
    try:
        error, code = await _refusal(server.ws_url)
        assert error["code"] == "busy" and code == 1013
        assert "address" in str(error["message"])
    finally:
        await first.close()
        await second.close()


async def _busy(ws: object, limit_s: float = 10.0) -> dict[str, object]:
    """The next JSON event, which must be a non-fatal ``busy`` error."""
    async with asyncio.timeout(limit_s):
        while True:
            raw = await ws.recv()  # type: ignore[attr-defined]
            if isinstance(raw, str):
                event: dict[str, object] = json.loads(raw)
                assert event["type"] == "error", event
                assert event["code"] == "busy" and event["fatal"] is False, event
                return event


#: a listener that never reports playback: a committed sentence stays in
#: progress (and holds its stream slot) until it is cancelled
HELD = {"flow_control": "ack", "max_lead_ms": 100, **STREAM}


async def _hold_slot(ws: object, context_id: str | None = None) -> None:
    """Commit a sentence on ``ws`` and wait until its audio started."""
    cid = {} if context_id is None else {"context_id": context_id}
    await send(ws, type="input.text", text="Holding a stream slot for a while.", **cid)  # type: ignore[arg-type]
    await send(ws, type="input.flush", **cid)  # type: ignore[arg-type]
    await recv_until(ws, Transcript(), stop="audio.start", limit_s=20)  # type: ignore[arg-type]


@asynccontextmanager
async def _one_slot_held(
    server: RunningServer,
) -> AsyncIterator[tuple[ClientConnection, Callable[[], Awaitable[None]]]]:
    """Two sessions, the server's one admission held by the first
    (``_hold_slot``): yields the second and ``release``, which ends the
    first session (a conversation gives its admission back when it ends;
    called on exit if not before)."""
    async with await open_ws(server.ws_url) as a, await open_ws(server.ws_url) as b:
        await a.recv()
        await b.recv()
        await send(a, type="session.config", **HELD)
        await a.recv()
        await _hold_slot(a)
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                await a.close()

        yield b, release
        await release()


async def test_a_session_beyond_the_door_waits_and_is_then_served(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(max_active_streams=1, admission_deadline_s=30.0)
    async with _one_slot_held(server) as (b, release):
        await send(b, type="input.text", text="I wait for a slot.")
        await send(b, type="input.done")
        async with asyncio.timeout(10):
            while server.state.admission.queue.depth != 1:
                await asyncio.sleep(0.01)
        await release()  # the first session ends; its admission goes to the waiting one
        t = await recv_until(b, Transcript(), limit_s=30)
        assert not t.of("error")
        (done,) = t.of("session.done")
        assert done["total_sentences"] == 1 and not done["cancelled"]
        assert done["metrics"]["admission_wait_ms"] > 0
        assert done["metrics"]["first_audio_ms"] >= done["metrics"]["admission_wait_ms"]
    assert server.state.admission.active == 0


async def test_a_session_past_the_deadline_is_busy_before_any_audio(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(max_active_streams=1, admission_deadline_s=0.3)
    async with _one_slot_held(server) as (b, _):
        await send(b, type="input.text", text="No room for me.")
        await send(b, type="input.done")
        error = await _busy(b)
        assert error["retry_after_ms"] == 1000 and "within 0.3 s" in str(error["message"])
        assert 300 <= error["waited_ms"] < 3000  # it waited for the deadline, then was told
        t = await recv_until(b, Transcript(), limit_s=10)
        (cancelled,) = t.of("audio.cancelled")
        assert cancelled["unspoken_text"] == "No room for me." and cancelled["spoken_text"] == ""
        assert t.of("session.done")[0]["cancelled"]
        assert server.state.admission.queue.depth == 0
    assert server.state.admission.active == 0


async def test_without_a_queue_text_beyond_the_slots_is_refused(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(max_active_streams=1, admission_queue_length=0)
    async with _one_slot_held(server) as (b, release):
        await send(b, type="input.text", text="No room for me.")
        error = await _busy(b)
        assert "not accepted" in str(error["message"]) and error["retry_after_ms"] == 5000
        assert error.get("waited_ms") is None  # refused at once
        await release()  # the first session ends; then the second may speak
        await send(b, type="input.text", text="Now there is room.")
        await send(b, type="input.done")
        t = await recv_until(b, Transcript(), limit_s=30)
        assert t.of("session.done")[0]["total_sentences"] == 1
    assert server.state.admission.active == 0


async def test_a_silent_ack_listener_is_told_and_its_session_goes_on(
    server_factory: Callable[..., RunningServer],
) -> None:
    """``flow_control: "ack"`` with no ``playback``: after ``ack_timeout_s``
    the utterance is cancelled and reported and the client gets
    ``listener_silent``; the session keeps its admission and is served
    once it listens."""
    server = server_factory(max_active_streams=1, ack_timeout_s=0.5)
    async with await open_ws(server.ws_url) as a:
        await a.recv()
        await send(a, type="session.config", **HELD)
        await a.recv()
        await _hold_slot(a)
        assert server.state.admission.active == 1
        t = await recv_until(a, Transcript(), stop="session.done", limit_s=20)
        (error,) = t.of("error")
        assert error["code"] == "listener_silent" and error["fatal"] is False
        (cancelled,) = t.of("audio.cancelled")
        assert cancelled["position_source"] == "played_ms" and cancelled["unspoken_text"]
        assert t.of("session.done")[0]["cancelled"]
        assert server.state.admission.active == 1  # still admitted
        # the session goes on: a client that reports is served
        await send(a, type="session.config", flow_control="none")
        await a.recv()
        await send(a, type="input.text", text="Now I listen.")
        await send(a, type="input.done")
        t = await recv_until(a, Transcript(), limit_s=30)
        assert not t.of("error") and not t.of("session.done")[0]["cancelled"]


async def test_idle_unfinished_utterances_hold_no_stream_slot(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Two sessions, 8 contexts each holding an unfinished utterance (no
    flush), used to take 16 server-wide slots; now they hold none."""
    server = server_factory()
    assert server.settings.max_active_streams >= 16 and server.settings.max_contexts == 8
    holders = [await open_ws(server.ws_url) for _ in range(2)]
    try:
        for ws in holders:
            await ws.recv()
            await send(ws, type="session.config", split_granularity="none", **STREAM)
            await ws.recv()
            for i in range(8):
                await send(ws, type="input.text", text="hold ", context_id=f"c{i}")
            await send(ws, type="ping", id="sync")  # every input.text was handled
            t = await recv_until(ws, Transcript(), stop="pong", limit_s=10)
            assert not t.of("error"), t.of("error")
        assert server.state.admission.active == 0
        async with await open_ws(server.ws_url) as c:
            await c.recv()
            await send(c, type="session.config", **STREAM)
            await c.recv()
            await send(c, type="input.text", text="Somebody else speaks.")
            await send(c, type="input.done")
            t = await recv_until(c, Transcript(), limit_s=30)
            assert not t.of("error") and t.of("session.done")[0]["total_sentences"] == 1
    finally:
        for ws in holders:
            await ws.close()
    for _ in range(100):
        if server.state.admission.active == 0:
            break
        await asyncio.sleep(0.05)
    assert server.state.admission.active == 0


async def test_a_session_share_delays_its_third_context_never_refuses(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(max_streams_per_session=2)
    async with await open_ws(server.ws_url) as a, await open_ws(server.ws_url) as b:
        await a.recv()
        await b.recv()
        await send(a, type="session.config", framing="tagged", **HELD)
        await a.recv()
        for cid in ("x", "y"):
            await _hold_slot(a, cid)
        await send(a, type="input.text", text="A third one.", context_id="z")
        await send(a, type="input.flush", context_id="z")
        await send(a, type="ping", id="sync")
        t = await recv_until(a, Transcript(), stop="pong", limit_s=10)
        assert not t.of("error") and not t.of("audio.start")  # accepted, waiting
        # the rest of the server is open to others
        await send(b, type="session.config", **STREAM)
        await b.recv()
        await send(b, type="input.text", text="Another session speaks.")
        await send(b, type="input.done")
        t = await recv_until(b, Transcript(), limit_s=30)
        assert not t.of("error") and t.of("session.done")[0]["total_sentences"] == 1
        # a cancel frees the session's share: the third context speaks
        await send(a, type="cancel", context_id="x")
        t = await recv_until(a, Transcript(), stop="audio.start", limit_s=20)
        assert t.of("audio.start")[-1]["context_id"] == "z" and not t.of("error")
        assert server.state.admission.active == 2  # two sessions admitted
    for _ in range(100):
        if server.state.admission.active == 0:
            break
        await asyncio.sleep(0.05)
    assert server.state.admission.active == 0


async def test_message_rate_limit(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(max_messages_per_second=5)
    async with await open_ws(server.ws_url) as ws:
        await ws.recv()
        for i in range(20):
            await send(ws, type="ping", id=i)
        t = Transcript()
        async with asyncio.timeout(5):
            while not t.of("error"):
                t.items.append(json.loads(await ws.recv()))
        error = t.of("error")[0]
        assert error["code"] == "rate_limited" and not error["fatal"]
        assert len(t.of("pong")) <= 6
        await asyncio.sleep(1.2)  # the bucket refills: the session goes on
        await send(ws, type="ping", id="after")
        async with asyncio.timeout(5):
            while True:
                event = json.loads(await ws.recv())
                if event == {"type": "pong", "id": "after"}:
                    break


async def test_connection_rate_limit(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(max_connections_per_minute=2)
    for _ in range(2):
        async with await open_ws(server.ws_url) as ws:
            await ws.recv()
    error, code = await _refusal(server.ws_url)
    assert error["code"] == "rate_limited" and code == 1008


@pytest.mark.parametrize("form", ["header", "query", "subprotocol"])
async def test_api_key_forms(server_factory: Callable[..., RunningServer], form: str) -> None:
    server = server_factory(api_keys=["s3cret-key"])
    url = server.ws_url
    kwargs: dict[str, object] = {}
    if form == "header":
        kwargs["additional_headers"] = {"Authorization": "Bearer s3cret-key"}
    elif form == "query":
        url += "?api_key=s3cret-key"
    else:
        kwargs["subprotocols"] = ["tts.v1", "tts.key.s3cret-key"]
    async with await open_ws(url, **kwargs) as ws:  # type: ignore[arg-type]
        assert json.loads(await ws.recv())["type"] == "session.created"
        if form == "subprotocol":
            assert ws.subprotocol == "tts.v1"


async def test_wrong_key_is_explained_then_closed(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(api_keys=["s3cret-key"])
    error, code = await _refusal(server.ws_url + "?api_key=wrong")
    assert error["code"] == "unauthorized" and error["fatal"] is True and code == 1008
    error, code = await _refusal(server.ws_url)
    assert error["code"] == "unauthorized" and code == 1008


async def test_origin_rules(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(allowed_origins=["https://app.example"])
    host = server.http.removeprefix("http://")
    for origin in (f"http://{host}", "https://app.example"):
        async with await open_ws(server.ws_url, origin=origin) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
    error, code = await _refusal(server.ws_url, origin="https://evil.example")
    assert error["code"] == "origin_not_allowed" and code == 1008


def test_api_key_never_logged(tmp_path: Path) -> None:
    """A real `python -m gateway serve` process, debug logging and uvicorn's
    access log on: the key presented in a query string, a header and a
    subprotocol never appears in its output."""
    key = "topsecret-123"
    with serve_process(tmp_path, api_keys=key, engine="synthetic", log_level="debug") as server:
        httpx.get(f"{server.base}/readyz?api_key={key}")
        httpx.get(f"{server.base}/healthz", headers={"Authorization": f"Bearer {key}"})

        async def talk() -> None:
            async with await open_ws(f"{server.ws_url}?api_key={key}") as ws:
                await ws.recv()
            subprotocols = ["tts.v1", f"tts.key.{key}"]
            async with await open_ws(server.ws_url, subprotocols=subprotocols) as ws:
                await ws.recv()
            async with await open_ws(f"{server.ws_url}?api_key=wrong-{key}") as ws:
                await ws.recv()

        asyncio.run(talk())
    output = server.output()
    assert "GET /readyz" in output  # the access log was on
    assert "session opened" in output
    assert key not in output
    assert "api_key=***" in output


async def test_idle_timeout_reports_unspoken_text_and_closes_4002(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(idle_timeout_s=1.0)
    async with await open_ws(server.ws_url) as ws:
        await ws.recv()
        await send(ws, type="session.config", split_granularity="sentence", **STREAM)
        await ws.recv()
        # one utterance spoken to the end: a long wait for it is not idleness
        await send(ws, type="input.text", text="A whole sentence is spoken first.")
        await send(ws, type="input.done")
        await recv_until(ws, Transcript())
        # then half a sentence, and silence
        await send(ws, type="input.text", text="and then the client goes quiet")
        t = Transcript()
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                raw = await ws.recv()
                t.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4002
        assert t.types() == ["error", "audio.cancelled", "session.done"]
        assert t.of("error")[0]["code"] == "timeout" and t.of("error")[0]["fatal"]
        assert t.of("audio.cancelled")[0]["unspoken_text"] == "and then the client goes quiet"
