"""Application-level flow control on the real server (the pure listener model:
tests/flow/test_listener.py)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest

from tests.conftest import RunningServer
from tests.helpers import Transcript, open_ws, recv_until, send

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for a hundred years. "
    "Every night its lamp turned slowly over the dark water. "
    "Sailors far away counted the flashes and knew where the rocks were."
)


def _underruns(server: RunningServer) -> float:
    text = httpx.get(server.http + "/metrics").text
    return float(re.search(r"^gateway_underruns_total (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]


async def _audio_ms_until_quiet(ws: object, t: Transcript, quiet_s: float) -> float:
    """Read until no message arrived for ``quiet_s``; audio ms received so far."""
    while True:
        try:
            raw = await asyncio.wait_for(ws.recv(), quiet_s)  # type: ignore[attr-defined]
        except TimeoutError:
            break
        t.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
    return sum(len(b) for b in t.binary) / 2 / 22050 * 1000


async def test_ack_holds_at_the_bound_and_releases_on_reports(
    piper_server: RunningServer,
) -> None:
    async with await open_ws(piper_server.ws_url) as ws:
        await ws.recv()
        config = {"flow_control": "ack", "max_lead_ms": 500, "stream_audio": True}
        await send(ws, type="session.config", response_format="pcm", frame_ms=20, **config)
        await ws.recv()
        await send(ws, type="input.text", text=PARAGRAPH)
        await send(ws, type="input.done")
        t = Transcript()
        held = await _audio_ms_until_quiet(ws, t, 1.5)
        assert 480 <= held <= 500  # stops at the bound, within a frame
        await send(ws, type="playback", played_ms=300)
        released = await _audio_ms_until_quiet(ws, t, 1.0)
        assert 780 <= released <= 800  # about X more after a report of +X
        # the listener catches up with everything sent while the server
        # still has text to speak: one underrun episode on /metrics
        before = _underruns(piper_server)
        await send(ws, type="playback", played_ms=released)
        await send(ws, type="playback", played_ms=released)  # same episode
        await send(ws, type="ping", id="sync")
        while True:
            raw = await ws.recv()
            if isinstance(raw, str) and json.loads(raw).get("id") == "sync":
                break
            t.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
        assert _underruns(piper_server) == before + 1
        await send(ws, type="cancel")
        await recv_until(ws, t)
        report = t.of("audio.cancelled")[0]
        assert report["position_source"] == "played_ms"
        received = sum(len(b) for b in t.binary) / 2 / 22050 * 1000
        assert report["played_ms"] == released
        assert report["sent_ms"] == pytest.approx(received, abs=0.01)


async def test_realtime_never_runs_ahead_of_the_clock(piper_server: RunningServer) -> None:
    """Audio clocks, not delivery slack: the server starts its clock no
    earlier than the text was sent, and a frame is received no earlier than
    it was sent, so audio received by any moment is at most the time since
    the text was sent plus the lead and one frame, however late this client
    reads.  The cancel report states the server's own clocks: what it sent
    and its estimate of what was heard, at most the lead apart, the estimate
    never ahead of real time."""
    lead_ms, frame_ms = 300, 20
    async with await open_ws(piper_server.ws_url) as ws:
        await ws.recv()
        config = {"flow_control": "realtime", "max_lead_ms": lead_ms, "stream_audio": True}
        await send(ws, type="session.config", response_format="pcm", frame_ms=frame_ms, **config)
        await ws.recv()
        text_sent_at = time.monotonic()
        await send(ws, type="input.text", text=PARAGRAPH)
        await send(ws, type="input.done")
        t = Transcript()
        async with asyncio.timeout(30):
            while len(t.binary) < 100:
                raw = await ws.recv()
                if isinstance(raw, bytes):
                    t.items.append(raw)
                    received_ms = sum(len(b) for b in t.binary) / 2 / 22050 * 1000
                    since_text_ms = (time.monotonic() - text_sent_at) * 1000
                    assert received_ms <= since_text_ms + lead_ms + frame_ms + 0.5  # +0.5: float ms
        await send(ws, type="cancel")
        await recv_until(ws, t)
        answered_at = time.monotonic()
        report = t.of("audio.cancelled")[0]
        assert report["position_source"] == "estimate"
        received_ms = sum(len(b) for b in t.binary) / 2 / 22050 * 1000
        assert report["sent_ms"] == pytest.approx(received_ms, abs=0.01)
        assert report["sent_ms"] >= 100 * frame_ms - 1  # the lead is small beside it
        assert report["sent_ms"] - report["played_ms"] <= lead_ms + frame_ms
        assert report["played_ms"] <= (answered_at - text_sent_at) * 1000
