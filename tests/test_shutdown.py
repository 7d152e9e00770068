"""Graceful shutdown of a real ``python -m gateway serve`` process on SIGTERM,
mid-utterance.

The synthetic engine is used: this is about lifecycle, not speech, and its
tones have realistic durations (60 ms per character) while costing no CPU.
Sessions use ``realtime`` flow control so their audio takes wall time.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from tests.helpers import Transcript, open_ws, send, serve_process

REALTIME = {
    "response_format": "pcm",
    "stream_audio": True,
    "frame_ms": 20,
    "flow_control": "realtime",
    "max_lead_ms": 300,
    "split_granularity": "sentence",
}
SHORT = "This one is short and it ends soon."  # about 2 s of audio
LONG = " ".join(["This utterance is far too long to finish while the server drains."] * 4)


async def _speaking(url: str, text: str, done: bool) -> ClientConnection:
    ws = await open_ws(url)
    await ws.recv()
    await send(ws, type="session.config", **REALTIME)
    await ws.recv()
    await send(ws, type="input.text", text=text)
    if done:
        await send(ws, type="input.done")
    while not isinstance(await ws.recv(), bytes):
        pass
    return ws


async def _until_closed(ws: ClientConnection) -> tuple[Transcript, int | None]:
    t = Transcript()
    try:
        async with asyncio.timeout(30):
            while True:
                raw = await ws.recv()
                t.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
    except ConnectionClosed as closed:
        return t, closed.rcvd.code if closed.rcvd else None


def test_sigterm_drains_then_exits_0(tmp_path: Path) -> None:
    with serve_process(tmp_path, engine="synthetic", drain_timeout_s=4) as server:
        base, url = server.base, server.ws_url
        results: dict[str, Any] = {}

        async def scenario() -> None:
            finishing = await _speaking(url, SHORT, done=True)
            open_text = await _speaking(url, SHORT + " And more", done=False)
            too_long = await _speaking(url, LONG, done=True)
            server.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            async with httpx.AsyncClient() as http:
                while (await http.get(f"{base}/readyz")).status_code != 503:
                    await asyncio.sleep(0.01)
                # the server's own state, not a stopwatch: readiness flipped
                # while the drain still held sessions open
                metrics = (await http.get(f"{base}/metrics")).text
            active = re.search(r"^gateway_sessions_active (\S+)$", metrics, re.MULTILINE)
            assert active is not None
            results["sessions_at_503"] = float(active.group(1))
            refused = await open_ws(url)
            results["refused"] = json.loads(await refused.recv())
            try:
                await refused.recv()
            except ConnectionClosed as closed:
                results["refused_code"] = closed.rcvd.code if closed.rcvd else None
            outcomes = await asyncio.gather(
                _until_closed(finishing), _until_closed(open_text), _until_closed(too_long)
            )
            results["outcomes"] = outcomes
            results["closed_after"] = time.monotonic() - signalled

        asyncio.run(scenario())
        exit_code = server.proc.wait(timeout=20)  # the one SIGTERM above, no second
    output = server.output()
    assert exit_code == 0, output
    assert results["sessions_at_503"] >= 1  # not ready, and still draining
    assert results["refused"]["code"] == "busy" and results["refused_code"] == 1013
    (finished, code_a), (cancelled, code_b), (cut, code_c) = results["outcomes"]
    assert code_a == code_b == code_c == 1001
    # input.done received: spoken to the end
    done = finished.of("session.done")
    assert len(done) == 1 and done[0]["cancelled"] is False
    assert not finished.of("audio.cancelled")
    # no input.done: cancelled and reported at once, nothing after the report
    report = cancelled.of("audio.cancelled")[0]
    assert (report["spoken_text"] + " " + report["unspoken_text"]).split() == (
        SHORT + " And more"
    ).split()
    assert "<bin>" not in cancelled.types()[cancelled.types().index("audio.cancelled") :]
    assert cancelled.of("session.done")[0]["cancelled"] is True
    # input.done but longer than the drain timeout: cancelled when it expires
    assert cut.of("audio.cancelled") and cut.of("session.done")[0]["cancelled"] is True
    assert cut.of("audio.cancelled")[0]["unspoken_text"]  # the drain did not wait for it
    # the drain waited its timeout (4 s; load only makes it later), then ended
    # by itself: the process exited after the one SIGTERM (wait above)
    assert results["closed_after"] > 3.5
