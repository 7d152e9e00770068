"""When do admitted conversations' gaps happen in an overload?

    .venv/bin/python bench/overload_timeline.py --url ws://127.0.0.1:PORT/v1/audio/speech/stream

The harness's overload scenario (``gateway.bench.load.overload``: 40 users
arriving within 3 s, one LLM-paced paragraph each, 8 client addresses,
seed 0) against a running server, printing what the scenario's summary
hides: per admitted session, when its first audio came and each gap of
over 30 ms, from the start (``U``: an underrun, the server's audio late;
``S``: starvation, the client's text late; ``-``: neither, at most 100
ms), when the refusals came, and the harness's own event-loop lag (over
30 ms), so a gap the harness caused is told from one the server caused.
One line of totals per run: refused, admitted, admitted with an underrun,
the worst underrun.  ``--runs N`` repeats it; alternate two servers' URLs
in one sitting to compare them (docs/benchmarks.md, round 13).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from gateway.bench.drivers import Pacing
from gateway.bench.load import overload_records
from gateway.bench.measure import playout


async def run(url: str, sessions: int, arrival_s: float, addresses: int) -> None:
    pacing = Pacing(streamed=True, token_rate=20.0, jitter=0.5)  # the harness's defaults
    t0 = time.monotonic()
    lags: list[tuple[float, int]] = []

    async def monitor() -> None:
        while True:
            start = time.monotonic()
            await asyncio.sleep(0.01)
            late = time.monotonic() - start - 0.01
            if late > 0.03:
                lags.append((round(start - t0, 2), round(late * 1000)))

    watch = asyncio.create_task(monitor())
    records = await overload_records(
        url, sessions=sessions, arrival_s=arrival_s, addresses=addresses, pacing=pacing, seed=0
    )
    watch.cancel()
    refused = sorted(round(r.error_at - t0, 2) for r in records if r.error and r.error_at)
    if refused:
        print(f"refusals from {refused[0]} s to {refused[-1]} s; harness lags {lags}")
    admitted = [r for r in records if not r.error]
    worst, gapped = 0.0, 0
    for r in admitted:
        heard = playout(r.pieces(), 0.0)
        gaps = [
            (
                round(g.start - t0, 2),
                round(g.ms),
                "U" if g.underrun else "S" if g.starvation else "-",
            )
            for g in heard.gaps
            if g.ms > 30
        ]
        underruns = [g.ms for g in heard.gaps if g.underrun]
        gapped += bool(underruns)
        worst = max([worst, *underruns])
        first = round(r.arrivals[0] - t0, 2) if r.arrivals else None
        print(f"  session {r.user}: first audio at {first} s, gaps {gaps}")
    print(
        f"refused {len(refused)} admitted {len(admitted)} with an underrun {gapped}"
        f" worst {worst:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the server's WebSocket URL")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--arrival-s", type=float, default=3.0)
    parser.add_argument("--addresses", type=int, default=8)
    args = parser.parse_args()
    for _ in range(args.runs):
        asyncio.run(run(args.url, args.sessions, args.arrival_s, args.addresses))


if __name__ == "__main__":
    main()
