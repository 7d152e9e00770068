"""The upstream relay's cost: time to first audio through a gateway in
``upstream`` mode against the upstream's own HTTP time to first byte.

    .venv/bin/python bench/upstream_relay.py --requests 40 [--engine piper]

Starts two real processes on loopback: an upstream replica (``python -m
gateway serve`` with ``--engine``, synthetic by default) and a gateway with
``engine = "upstream"`` in front of it.  Everything runs at the replica's
native rate (the session's ``sample_rate``, the HTTP ``sample_rate``, and
``upstream.send_sample_rate``), so no resampling is counted.  Per round, in
alternating order:

* ``direct_http``: ``POST /v1/audio/speech`` to the replica (``stream: true``,
  ``pcm``), request sent -> first body byte (a keep-alive client, as the
  relay's own);
* ``relay_http``: the same request to the front gateway;
* ``relay_ws``: one WebSocket session to the front gateway (opened once),
  ``input.text`` + ``input.done`` sent -> first binary frame.

Prints one JSON line with the machine and versions, one per measurement, and
a summary per mode with p50/p90 and the p50 added by the relay (the issue's
target: at most 15 ms added at p50).  A quiet machine gives the figures the
README may quote; a shared one only shows the shape.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import websockets

from gateway.bench.runner import free_port, gateway_command, machine_info, started

TEXT = "The quick brown fox jumped over the lazy dog while the curious cat watched quietly."


def serve(
    port: int, env: dict[str, str], log: Path
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """A gateway process on ``port`` with ``env`` added, until the block ends."""
    return started(gateway_command(port), f"http://127.0.0.1:{port}/readyz", log, env)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def http_ttfb(client: httpx.AsyncClient, base: str, voice: str, rate: int) -> float:
    body = {
        "input": TEXT,
        "voice": voice,
        "stream": True,
        "stream_format": "audio",
        "response_format": "pcm",
        "sample_rate": rate,
    }
    first = None
    start = time.perf_counter()
    async with client.stream("POST", base + "/v1/audio/speech", json=body) as response:
        response.raise_for_status()
        async for piece in response.aiter_raw():  # read to the end: keep-alive reuse
            if piece and first is None:
                first = time.perf_counter() - start
    assert first is not None
    return first


async def ws_ttfa(ws: Any) -> float:
    start = time.perf_counter()
    await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
    await ws.send(json.dumps({"type": "input.done"}))
    first = None
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            if first is None:
                first = time.perf_counter() - start
            continue
        if json.loads(message)["type"] == "session.done":
            break
    assert first is not None
    return first


async def measure(args: argparse.Namespace, replica: str, front: str) -> None:
    async with httpx.AsyncClient() as client:
        voices = (await client.get(replica + "/v1/audio/voices")).json()["data"]
    voice = next(v for v in voices if v["type"] == "builtin")
    rate = int(voice["sample_rate"])
    results: dict[str, list[float]] = {"direct_http": [], "relay_http": [], "relay_ws": []}
    ws_url = front.replace("http://", "ws://") + "/v1/audio/speech/stream"
    async with (
        httpx.AsyncClient(timeout=60) as client,
        websockets.connect(ws_url, max_size=None, compression=None) as ws,
    ):
        await ws.recv()  # session.created
        config = {"type": "session.config", "voice": voice["name"], "sample_rate": rate}
        await ws.send(
            json.dumps({**config, "response_format": "pcm", "stream_audio": True, "frame_ms": 20})
        )
        for _ in range(3):  # warm the connections and both servers
            await http_ttfb(client, replica, voice["name"], rate)
            await http_ttfb(client, front, voice["name"], rate)
            await ws_ttfa(ws)
        for i in range(args.requests):
            order = ["direct_http", "relay_http", "relay_ws"]
            if i % 2:
                order.reverse()
            for mode in order:
                if mode == "relay_ws":
                    value = await ws_ttfa(ws)
                else:
                    base = replica if mode == "direct_http" else front
                    value = await http_ttfb(client, base, voice["name"], rate)
                results[mode].append(value * 1000)
                print(json.dumps({"mode": mode, "round": i, "ms": round(value * 1000, 2)}))
    direct = percentile(results["direct_http"], 50)
    for mode, values in results.items():
        p50 = percentile(values, 50)
        print(
            json.dumps(
                {
                    "summary": mode,
                    "engine": args.engine,
                    "rate": rate,
                    "n": len(values),
                    "p50_ms": round(p50, 2),
                    "p90_ms": round(percentile(values, 90), 2),
                    "added_p50_ms": round(p50 - direct, 2),
                }
            )
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=40, help="rounds (each: 3 requests)")
    parser.add_argument("--engine", default="synthetic", help="the replica's engine")
    args = parser.parse_args(argv)
    print(json.dumps({"machine": machine_info(), "bench": "upstream_relay"}))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        replica_port, front_port = free_port(), free_port()
        replica = f"http://127.0.0.1:{replica_port}"
        front = f"http://127.0.0.1:{front_port}"
        replica_env = {"GATEWAY_ENGINE": args.engine, "GATEWAY_DATA_DIR": str(work / "replica")}
        front_env = {
            "GATEWAY_ENGINE": "upstream",
            "GATEWAY_DATA_DIR": str(work / "front"),
            "GATEWAY_UPSTREAM_URLS": replica,
            "GATEWAY_UPSTREAM_HEALTH_PATH": "/healthz",
            "GATEWAY_UPSTREAM_READY_PATHS": "/v1/audio/voices",
            "GATEWAY_UPSTREAM_SEND_SAMPLE_RATE": "true",
        }
        with (
            serve(replica_port, replica_env, work / "replica.log"),
            serve(front_port, front_env, work / "front.log"),
        ):
            asyncio.run(measure(args, replica, front))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
