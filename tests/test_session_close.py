"""``session.close`` is polite (protocol 2.0.0), on a real server.

What was flushed is spoken before the close, ``playback`` and ``cancel`` are
still read meanwhile, ``drain_timeout_s`` bounds the wait, and text never
flushed is reported unspoken.  vllm-omni's clients send ``input.text``,
``input.done`` and ``session.close`` back to back and expect the whole
utterance.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from tests.conftest import RunningServer
from tests.helpers import Transcript, open_ws, recv_until, send

SENTENCES = "The quick brown fox jumps over the lazy dog. It was a bright cold day in April."
PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for a hundred years. "
    "Every night its lamp turned slowly over the dark water. "
    "Sailors far away counted the flashes and knew where the rocks were. "
    "One winter a storm broke the glass and the keeper climbed up to fix it."
)
STREAM = {"response_format": "pcm", "stream_audio": True, "frame_ms": 20}


def _item(raw: str | bytes) -> dict[str, Any] | bytes:
    return raw if isinstance(raw, bytes) else json.loads(raw)


async def _until_closed(ws: ClientConnection, t: Transcript, limit_s: float = 60.0) -> int:
    """Record everything until the server closes; its close code."""
    async with asyncio.timeout(limit_s):
        try:
            while True:
                t.items.append(_item(await ws.recv()))
        except ConnectionClosed as closed:
            assert closed.rcvd is not None, "the client closed, not the server"
            return closed.rcvd.code


async def _configured(server: RunningServer, **config: Any) -> ClientConnection:
    ws = await open_ws(server.ws_url)
    assert json.loads(await ws.recv())["type"] == "session.created"
    if config:
        await send(ws, type="session.config", **config)
        assert json.loads(await ws.recv())["type"] == "session.updated"
    return ws


async def test_close_right_after_done_speaks_the_whole_utterance(
    piper_server: RunningServer,
) -> None:
    """vllm-omni's order, with its defaults (one WAV per sentence): all the
    bytes, then session.done, then close 1000 (on 1.x: 0 bytes)."""
    async with await _configured(piper_server) as ws:
        await send(ws, type="input.text", text=SENTENCES)
        await send(ws, type="input.done")
        reference = await recv_until(ws, Transcript())
    async with await _configured(piper_server) as ws:
        await send(ws, type="input.text", text=SENTENCES)
        await send(ws, type="input.done")
        await send(ws, type="session.close")
        t = Transcript()
        assert await _until_closed(ws, t) == 1000
    assert "audio.cancelled" not in t.types()
    assert t.types()[-1] == "session.done" and t.of("session.done")[0]["cancelled"] is False
    assert sum(map(len, t.binary)) == sum(map(len, reference.binary)) > 0
    assert [d["total_bytes"] for d in t.of("audio.done")] == [
        d["total_bytes"] for d in reference.of("audio.done")
    ]


async def test_playback_is_read_while_closing(server_factory: Callable[..., RunningServer]) -> None:
    """Under ``ack`` the audio after session.close waits for playback
    reports: they are still read, and the utterance ends whole."""
    server = server_factory(ack_timeout_s=30)
    async with await _configured(server, flow_control="ack", max_lead_ms=200, **STREAM) as ws:
        await send(ws, type="input.text", text=SENTENCES)
        await send(ws, type="input.done")
        await send(ws, type="session.close")
        t = Transcript()
        played_ms = 0.0
        rate = 0
        async with asyncio.timeout(60):
            try:
                while True:
                    item = _item(await ws.recv())
                    t.items.append(item)
                    if isinstance(item, dict) and item["type"] == "audio.start":
                        rate = item["sample_rate"]
                    if isinstance(item, bytes):  # heard at once
                        played_ms += len(item) / 2 / rate * 1000
                        if len(t.binary) % 5 == 0:  # every 100 ms of audio
                            await send(ws, type="playback", played_ms=played_ms)
            except ConnectionClosed as closed:
                assert closed.rcvd is not None and closed.rcvd.code == 1000
    assert "audio.cancelled" not in t.types() and "error" not in t.types(), t.events
    (done,) = t.of("session.done")
    assert done["cancelled"] is False and done["total_sentences"] == 2
    assert abs(done["metrics"]["audio_ms"] - played_ms) < 1


async def test_cancel_after_close_stops_the_audio(piper_server: RunningServer) -> None:
    """``cancel`` stays the barge-in while closing: the usual report, then 1000."""
    async with await _configured(piper_server, flow_control="realtime", **STREAM) as ws:
        await send(ws, type="input.text", text=PARAGRAPH)
        await send(ws, type="input.done")
        await send(ws, type="session.close")
        t = Transcript()
        while len(t.binary) < 10:  # audio flows after the close
            t.items.append(_item(await asyncio.wait_for(ws.recv(), 30)))
        await send(ws, type="cancel")
        assert await _until_closed(ws, t, limit_s=10) == 1000
    types = t.types()
    cancelled_at = types.index("audio.cancelled")
    assert "<bin>" not in types[cancelled_at:]
    assert types[cancelled_at + 1 :] == ["audio.done", "session.done"]
    report = t.of("audio.cancelled")[0]
    assert report["unspoken_text"] and report["position_source"] == "estimate"
    assert (report["spoken_text"] + " " + report["unspoken_text"]).split() == PARAGRAPH.split()
    assert t.of("session.done")[0]["cancelled"] is True


async def test_drain_timeout_bounds_the_close(server_factory: Callable[..., RunningServer]) -> None:
    """A long text paced in real time cannot finish within a short
    ``drain_timeout_s``: at the bound the rest is cancelled and reported."""
    server = server_factory(drain_timeout_s=1.0)
    async with await _configured(server, flow_control="realtime", **STREAM) as ws:
        await send(ws, type="input.text", text=PARAGRAPH)
        await send(ws, type="input.done")
        await send(ws, type="session.close")
        started = time.monotonic()
        t = Transcript()
        code = await _until_closed(ws, t, limit_s=15)
        elapsed = time.monotonic() - started
    assert code == 1000
    assert 1.0 <= elapsed < 4.0, elapsed  # PARAGRAPH is about 14 s of speech
    types = t.types()
    assert types[-1] == "session.done" and t.of("session.done")[0]["cancelled"] is True
    assert "<bin>" in types[: types.index("audio.cancelled")]  # spoken until the bound
    report = t.of("audio.cancelled")[0]
    assert report["spoken_text"] and report["unspoken_text"]
    assert 0 < report["sent_ms"] < 5000


async def test_text_never_flushed_is_reported_unspoken(piper_server: RunningServer) -> None:
    """input.flush committed the first part: spoken. The rest never left the
    segmenter: reported unspoken after it. Text after the close is refused."""
    async with await _configured(piper_server, split_granularity="sentence", **STREAM) as ws:
        await send(ws, type="input.text", text="Flushed words")
        await send(ws, type="input.flush")
        await send(ws, type="input.text", text=" and never flushed ones")
        await send(ws, type="session.close")
        await send(ws, type="input.text", text="Too late.")
        t = Transcript()
        assert await _until_closed(ws, t) == 1000
    (refused,) = t.of("error")
    assert refused["code"] == "invalid_state" and refused["fatal"] is False
    assert [s["sentence_text"] for s in t.of("audio.start")] == ["Flushed words"]
    assert t.types()[-3:] == ["audio.done", "audio.cancelled", "session.done"]
    report = t.of("audio.cancelled")[0]
    assert report["spoken_text"] == "Flushed words"
    assert report["unspoken_text"] == "and never flushed ones"
    assert report["played_ms"] == report["sent_ms"] > 0
    done = t.of("session.done")[0]
    assert done["cancelled"] is True and done["total_sentences"] == 1


async def test_voice_requests_are_answered_before_the_close(piper_server: RunningServer) -> None:
    """A voice request sent before session.close gets its answer first."""
    async with await _configured(piper_server) as ws:
        await send(ws, type="voice.list", request_id="before-close")
        await send(ws, type="session.close")
        t = Transcript()
        assert await _until_closed(ws, t) == 1000
    (result,) = t.of("voice.list.result")
    assert result["request_id"] == "before-close"
    assert any(v["name"] == "joe" for v in result["voices"])
