"""The hostile scenario's neighbours one at a time: which one makes the RSS peak.

What it measures: ``python -m gateway bench --scenarios hostile`` runs its
three neighbours (``alias``, ``numbers``, ``http``: ``gateway/bench/hostile.py``)
at once and reports one RSS peak per phase.  This runs each group given
(``alias``, ``numbers+http``, ...) alone for ``--seconds`` against a server
that is already running, samples the server's RSS every 250 ms, and prints
one JSON line per group: RSS before, its peak, 3 s after the neighbours
left, and the server's largest thread count.  No canary: the figure is
memory, not latency.

    GATEWAY_MAX_ACTIVE_STREAMS=8 .venv/bin/python -m gateway serve --port 8731 &
    .venv/bin/python bench/hostile_each.py --port 8731 --pid $! \\
        alias numbers http alias+numbers+http
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from typing import Any

from gateway.bench import hostile
from gateway.bench.load import rss_mib
from gateway.bench.provenance import source_revision


def threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


async def one_group(
    port: int, pid: int, names: list[str], phase: str, seconds: float
) -> dict[str, Any]:
    ws_url = f"ws://127.0.0.1:{port}/v1/audio/speech/stream"
    base = f"http://127.0.0.1:{port}"
    inputs = hostile.neighbour_inputs(phase)
    stop = asyncio.Event()
    idle = rss_mib(pid)
    peak = [idle or 0.0, 0]

    async def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mib(pid) or 0.0)
            peak[1] = max(peak[1], threads(pid))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)

    sampler = asyncio.create_task(sample())
    tasks = {
        name: asyncio.create_task(
            hostile._http_neighbour(base, inputs[name][0], stop)
            if name == "http"
            else hostile._ws_neighbour(ws_url, inputs[name][0], inputs[name][1], stop)
        )
        for name in names
    }
    await asyncio.sleep(seconds)
    stop.set()
    results = {name: await task for name, task in tasks.items()}
    await sampler
    await asyncio.sleep(3.0)
    return {
        "kind": "hostile_each",
        "neighbours": names,
        "phase": phase,
        "seconds": seconds,
        "rss_idle_mib": idle,
        "rss_peak_mib": peak[0],
        "rss_growth_mib": None if idle is None else round(peak[0] - idle, 1),
        "rss_after_mib": rss_mib(pid),
        "threads_max": peak[1],
        "neighbour": results,
        "loadavg_1m": os.getloadavg()[0],
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="the running server's port")
    parser.add_argument("--pid", type=int, required=True, help="the server's process id")
    parser.add_argument("--phase", choices=("hostile", "benign"), default="hostile")
    parser.add_argument("--seconds", type=float, default=24.0, help="each group's run")
    parser.add_argument(
        "groups", nargs="+", help="neighbours run together, joined by +: alias, numbers, http"
    )
    args = parser.parse_args()
    # the server's own commit is its checkout's: record it beside these lines
    print(json.dumps({"kind": "run", "harness_source": source_revision()}))
    for group in args.groups:
        names = group.split("+")
        unknown = set(names) - set(hostile.ENGINE_CHARS)
        if unknown:
            parser.error(f"unknown neighbours: {', '.join(sorted(unknown))}")
        line = asyncio.run(one_group(args.port, args.pid, names, args.phase, args.seconds))
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
