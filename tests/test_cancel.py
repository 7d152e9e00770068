"""Barge-in: cancel while audio flows, what was heard, abrupt disconnects."""

from __future__ import annotations

import asyncio
import json

from gateway.engines.base import Engine
from tests.conftest import RunningServer
from tests.helpers import Transcript, open_ws, recv_until, send

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for a hundred years. "
    "Every night its lamp turned slowly over the dark water. "
    "Sailors far away counted the flashes and knew where the rocks were. "
    "One winter a storm broke the glass and the keeper climbed up to fix it."
)
STREAM = {"response_format": "pcm", "stream_audio": True, "frame_ms": 20}


async def _wait_gauge(engine: Engine, baseline: int, limit_s: float = 10.0) -> int:
    async with asyncio.timeout(limit_s):
        while engine.live_jobs() > baseline:
            await asyncio.sleep(0.05)
    return engine.live_jobs()


async def test_cancel_while_frames_flow(piper_server: RunningServer) -> None:
    async with await open_ws(piper_server.ws_url) as ws:
        await ws.recv()
        await send(
            ws, type="session.config", split_granularity="sentence", timestamps=True, **STREAM
        )
        await send(ws, type="input.text", text=PARAGRAPH)
        await send(ws, type="input.done")
        t = Transcript()
        # read continuously; cancel after some audio arrived
        while len(t.binary) < 30:
            raw = await asyncio.wait_for(ws.recv(), 30)
            t.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
        await send(ws, type="cancel")
        await recv_until(ws, t)
        types = t.types()
        cancelled_at = types.index("audio.cancelled")
        assert "<bin>" not in types[cancelled_at:]
        assert types[cancelled_at + 1 :] == ["audio.done", "session.done"]
        report = t.of("audio.cancelled")[0]
        assert report["position_source"] == "sent_ms"
        assert report["played_ms"] == report["sent_ms"] > 0
        heard = (report["spoken_text"] + " " + report["unspoken_text"]).split()
        assert heard == PARAGRAPH.split()
        assert report["unspoken_text"]
        assert t.of("audio.done")[-1]["cancelled"] is True
        assert t.of("session.done")[0]["cancelled"] is True
        # the session goes on after a cancel
        await send(ws, type="input.text", text="Back again.")
        await send(ws, type="input.done")
        t2 = await recv_until(ws, Transcript())
        assert t2.of("session.done")[0]["cancelled"] is False


async def test_cancel_before_audio_reports_everything_unspoken(
    piper_server: RunningServer,
) -> None:
    async with await open_ws(piper_server.ws_url) as ws:
        await ws.recv()
        await send(ws, type="session.config", split_granularity="none", **STREAM)
        await ws.recv()
        await send(ws, type="input.text", text="Nothing of this was spoken", context_id="x")
        await send(ws, type="cancel", context_id="x")
        t = await recv_until(ws, Transcript())
        assert t.types() == ["audio.cancelled", "session.done"]
        report = t.of("audio.cancelled")[0]
        assert report["spoken_text"] == "" and report["sent_ms"] == 0
        assert report["unspoken_text"] == "Nothing of this was spoken"
        assert report["context_id"] == "x"


async def test_abrupt_disconnects_leave_no_engine_work(
    piper_server: RunningServer, piper_engine: Engine
) -> None:
    baseline = piper_engine.live_jobs()
    for _ in range(5):
        ws = await open_ws(piper_server.ws_url)
        await ws.recv()
        await send(ws, type="session.config", **STREAM)
        await send(ws, type="input.text", text=PARAGRAPH)
        await send(ws, type="input.done")
        while not isinstance(await ws.recv(), bytes):
            pass
        ws.transport.abort()  # no close handshake
    assert await _wait_gauge(piper_engine, baseline) == baseline
    async with asyncio.timeout(10):
        while piper_server.state.sessions:
            await asyncio.sleep(0.05)
