"""How far ahead of its listener is each stream, and where does that lead go?

    .venv/bin/python bench/boundary_leads.py --url ws://127.0.0.1:PORT/v1/audio/speech/stream

``--sessions`` users (default 16) start within ``--stagger-s`` seconds (default
1), each streaming one paragraph of the harness's corpus as LLM tokens (20
tokens/s with jitter, as the harness does); the paragraphs and start times
come from ``--seed``.  For each session, the *lead* at every audio piece is
the audio received so far minus the time since its first audio: what a
player that starts at the first frame holds in its buffer (negative: it ran
dry that long ago).  One JSON line per run: sessions with an underrun, the
10th percentile and median over sessions of each one's lowest lead after its
first second of audio, and the 10th percentile and lowest of the lead at the
harness's sentence boundaries (where a stream's next segment starts), and
the p95 of first audio from the first text sent.

What it answers that the harness's summary does not: whether a stream's
audio runs dry mid-sentence or where its next sentence starts (round 18,
docs/benchmarks.md: the harness's ladder and overload gapped where one
paragraph's third sentence starts; under this heavier burst streams run
dry mid-sentence too).  Alternate two servers' URLs in one sitting to
compare them; ``--label`` tags the line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random

from gateway.bench import corpus
from gateway.bench.drivers import GatewayUser, Pacing, Record
from gateway.bench.measure import playout


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def leads(record: Record) -> tuple[float, list[float]]:
    """A session's lowest lead after its first second of audio, and its lead
    at each sentence boundary (ms)."""
    first = record.arrivals[0]
    audio_ms, lowest, boundaries = 0.0, float("inf"), []
    previous: int | None = None
    for arrival, duration, sentence in zip(
        record.arrivals, record.durations_ms, record.piece_sentence, strict=True
    ):
        lead = audio_ms - (arrival - first) * 1000
        if audio_ms >= 1000:
            lowest = min(lowest, lead)
        if previous is not None and sentence != previous:
            boundaries.append(lead)
        previous = sentence
        audio_ms += duration
    return lowest, boundaries


async def run(url: str, sessions: int, stagger_s: float, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    texts = [rng.choice(corpus.PARAGRAPHS) for _ in range(sessions)]
    starts = sorted(rng.uniform(0, stagger_s) for _ in range(sessions))
    pacing = Pacing(streamed=True, token_rate=20.0, jitter=0.5)  # the harness's defaults

    async def one(i: int) -> Record:
        await asyncio.sleep(starts[i])
        record = Record("gateway", "boundary-leads", sessions, i, 0, texts[i])
        user = GatewayUser(url)
        await user.open()
        try:
            return await user.utterance(record, pacing, random.Random(f"{seed}:{i}"), None)
        finally:
            await user.close()

    records = [r for r in await asyncio.gather(*(one(i) for i in range(sessions))) if r.arrivals]
    lowest, boundaries, first_audio, underrun = [], [], [], 0
    for record in records:
        low, at_boundaries = leads(record)
        if low != float("inf"):
            lowest.append(low)
        boundaries += at_boundaries
        first_audio.append((record.arrivals[0] - record.sends[0][0]) * 1000)
        underrun += any(g.underrun for g in playout(record.pieces(), 0.0).gaps)
    return {
        "sessions": sessions,
        "spoke": len(records),
        "underrun_sessions": underrun,
        "min_lead_p10_ms": round(_quantile(lowest, 0.1)),
        "min_lead_p50_ms": round(_quantile(lowest, 0.5)),
        "boundary_lead_p10_ms": round(_quantile(boundaries, 0.1)),
        "boundary_lead_min_ms": round(min(boundaries)),
        "first_audio_p95_ms": round(_quantile(first_audio, 0.95)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the server's WebSocket URL")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--stagger-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    result = asyncio.run(run(args.url, args.sessions, args.stagger_s, args.seed))
    print(json.dumps({"label": args.label, "seed": args.seed, **result}), flush=True)


if __name__ == "__main__":
    main()
