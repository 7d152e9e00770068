"""Cancel (barge-in) latency and event-loop lag through a running gateway.

    .venv/bin/python bench/cancel_bench.py --rounds 5

Starts ``python -m gateway serve`` on a free loopback port (the real server,
default engine) and runs two scenarios:

* ``8_streaming``: 8 sessions speak at once; each, after a random 10 to 40
  frames, sends ``cancel`` and reads on (continuously) until ``session.done``;
  then speaks again, ``--rounds`` times.
* ``1_cancelling_4_speaking``: 4 other sessions speak continuously while one
  session does the same cancel rounds.

Per cancel it records ``cancel`` sent -> ``audio.cancelled`` received
(``ack_ms``), ``cancel`` sent -> the last binary frame received before the
report (``last_frame_ms``, 0 when no frame followed the cancel) and the frames
that followed the cancel.  Event-loop lag: the server's
``gateway_event_loop_lag_seconds`` histogram (a 100 ms timer's lateness),
read from ``/metrics`` before and after each scenario (percentiles are bucket
upper bounds), and a client-side probe: ``ping`` -> ``pong`` round trips on
an idle session every 50 ms.

Config: ``pcm``, ``stream_audio``, ``frame_ms`` 20, ``split_granularity``
"sentence", ``flow_control`` as ``--flow`` (default ``realtime``: listeners
play in real time, as voice agents do).  Prints one JSON line per cancel and
a summary line per scenario, after a line with the machine and versions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websockets

from gateway.bench.runner import free_port, gateway_command, started

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for a hundred years. "
    "Every night its lamp turned slowly over the dark water. "
    "Sailors far away counted the flashes and knew where the rocks were. "
    "One winter a storm broke the glass and the keeper climbed up to fix it."
)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def _lag_buckets(base: str) -> dict[float, float]:
    text = urllib.request.urlopen(f"{base}/metrics").read().decode()
    buckets: dict[float, float] = {}
    for le, count in re.findall(
        r'^gateway_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.MULTILINE
    ):
        buckets[float(le)] = float(count)
    return buckets


def _lag_percentiles(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    delta = {le: after[le] - before.get(le, 0.0) for le in after}
    total = delta.get(float("inf"), 0.0)
    out: dict[str, Any] = {"lag_samples": int(total)}
    for q in (50, 95, 99):
        bound = next((le for le in sorted(delta) if delta[le] >= total * q / 100), float("inf"))
        out[f"lag_p{q}_le_ms"] = bound * 1000 if bound != float("inf") else None
    return out


async def _open(url: str, flow: str) -> Any:
    ws = await websockets.connect(url, max_size=None, compression=None)
    await ws.recv()
    config = {
        "type": "session.config",
        "response_format": "pcm",
        "stream_audio": True,
        "frame_ms": 20,
        "split_granularity": "sentence",
        "flow_control": flow,
    }
    await ws.send(json.dumps(config))
    await ws.recv()
    return ws


async def _cancel_rounds(url: str, flow: str, rounds: int, label: str) -> list[dict[str, Any]]:
    results = []
    ws = await _open(url, flow)
    try:
        for _ in range(rounds):
            await ws.send(json.dumps({"type": "input.text", "text": PARAGRAPH}))
            await ws.send(json.dumps({"type": "input.done"}))
            wanted, frames = random.randint(10, 40), 0
            while frames < wanted:
                frames += isinstance(await ws.recv(), bytes)
            sent = time.perf_counter()
            await ws.send(json.dumps({"type": "cancel"}))
            last_frame, after, ack = sent, 0, None
            while True:
                message = await ws.recv()
                now = time.perf_counter()
                if isinstance(message, bytes):
                    last_frame, after = now, after + 1
                    continue
                kind = json.loads(message)["type"]
                if kind == "audio.cancelled":
                    ack = now
                elif kind == "session.done":
                    break
            assert ack is not None
            results.append(
                {
                    "scenario": label,
                    "ack_ms": round((ack - sent) * 1000, 2),
                    "last_frame_ms": round((last_frame - sent) * 1000, 2),
                    "frames_after_cancel": after,
                }
            )
    finally:
        await ws.close()
    return results


async def _speak_forever(url: str, flow: str, stop: asyncio.Event) -> None:
    ws = await _open(url, flow)
    try:
        while not stop.is_set():
            await ws.send(json.dumps({"type": "input.text", "text": PARAGRAPH}))
            await ws.send(json.dumps({"type": "input.done"}))
            while not stop.is_set():
                message = await ws.recv()
                if isinstance(message, str) and json.loads(message)["type"] == "session.done":
                    break
    finally:
        await ws.close()


async def _ping_probe(url: str, stop: asyncio.Event, rtts: list[float]) -> None:
    async with websockets.connect(url, compression=None) as ws:
        await ws.recv()
        i = 0
        while not stop.is_set():
            sent = time.perf_counter()
            await ws.send(json.dumps({"type": "ping", "id": i}))
            await ws.recv()
            rtts.append((time.perf_counter() - sent) * 1000)
            i += 1
            await asyncio.sleep(0.05)


async def _scenario(
    base: str, url: str, label: str, cancellers: int, speakers: int, args: argparse.Namespace
) -> None:
    stop = asyncio.Event()
    rtts: list[float] = []
    before = _lag_buckets(base)
    background = [
        asyncio.create_task(_speak_forever(url, args.flow, stop)) for _ in range(speakers)
    ]
    probe = asyncio.create_task(_ping_probe(url, stop, rtts))
    if speakers:
        await asyncio.sleep(1.0)  # the others are speaking
    rounds = await asyncio.gather(
        *(_cancel_rounds(url, args.flow, args.rounds, label) for _ in range(cancellers))
    )
    stop.set()
    await asyncio.gather(*background, probe, return_exceptions=True)
    after = _lag_buckets(base)
    results = [r for session in rounds for r in session]
    for r in results:
        print(json.dumps(r))
    acks = [r["ack_ms"] for r in results]
    lasts = [r["last_frame_ms"] for r in results]
    summary = {
        "summary": label,
        "cancels": len(results),
        "flow_control": args.flow,
        "ack_p50_ms": _percentile(acks, 50),
        "ack_p95_ms": _percentile(acks, 95),
        "ack_max_ms": max(acks),
        "last_frame_p50_ms": _percentile(lasts, 50),
        "last_frame_p95_ms": _percentile(lasts, 95),
        "frames_after_cancel_max": max(r["frames_after_cancel"] for r in results),
        "ping_rtt_p50_ms": round(_percentile(rtts, 50), 2),
        "ping_rtt_p95_ms": round(_percentile(rtts, 95), 2),
        "ping_rtt_p99_ms": round(_percentile(rtts, 99), 2),
        **_lag_percentiles(before, after),
    }
    print(json.dumps(summary), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="cancels per cancelling session")
    parser.add_argument("--flow", default="realtime", choices=["none", "ack", "realtime"])
    args = parser.parse_args()
    import uvicorn

    import gateway

    print(
        json.dumps(
            {
                "machine": platform.machine(),
                "processor": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "gateway": gateway.__version__,
                "uvicorn": uvicorn.__version__,
                "websockets": websockets.__version__,
            }
        )
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    url = f"ws://127.0.0.1:{port}/v1/audio/speech/stream"
    log = Path(tempfile.gettempdir()) / f"gateway-cancel-bench-{port}.log"
    with started(gateway_command(port), f"{base}/readyz", log):
        asyncio.run(_scenario(base, url, "8_streaming", 8, 0, args))
        asyncio.run(_scenario(base, url, "1_cancelling_4_speaking", 1, 4, args))


if __name__ == "__main__":
    main()
