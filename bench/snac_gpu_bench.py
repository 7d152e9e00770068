"""How many concurrent Orpheus streams one device decodes in real time.

Every tick decodes one new SNAC frame (85.33 ms of 24 kHz audio) for each of
N streams in one batch (``gateway.vocoders.snac_stream.SnacBatch``: stacked
carried state, one batched pass).  N climbs a ladder; for each N the script
prints the tick latency (p50, p95, mean; wall time including the copy of the
audio back to the host), and at the end the largest N whose p95 tick stays
within ``--p95-ms`` (20 ms) and whose mean tick stays under the 85.33 ms a
frame lasts (faster than real time), plus the decode time of a first frame
(a stream's first push into a warm batch) and the time to its first audio
(3 frames: the look-ahead).  Before the ladder it checks on the device that
the streamed decode equals the offline one (SNR, dB).  On CUDA the ladder
runs twice: eager ticks (``SnacBatch.step``) and CUDA-graph ticks
(``gateway.vocoders.snac_graph.GraphedTick``, checked first against eager);
streams are past their 3-frame warm-up when timing starts.

Self-contained: needs torch, snac (and einops, which snac imports) and this
repository's ``gateway/vocoders/snac_stream.py``; a seeded random-weight SNAC
with the 24 kHz configuration (the compute is the architecture's; nothing is
downloaded).  Prints JSON lines.

    PYTHONPATH=. python bench/snac_gpu_bench.py --device cuda
    PYTHONPATH=. python bench/snac_gpu_bench.py --device cpu --max-streams 4   # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import random
import statistics
import time
from typing import Any

import numpy as np
import torch

from gateway.vocoders import snac_stream
from gateway.vocoders.snac_graph import GraphedTick
from gateway.vocoders.snac_stream import (
    SnacBatch,
    SnacStream,
    SnacStreamDecoder,
    build_snac_24khz,
    decode_offline,
)

FRAME_MS = 2048 / 24000 * 1000


def _frame(rng: random.Random) -> tuple[int, ...]:
    return tuple(rng.randrange(4096) for _ in range(7))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_exact(model: Any, decoder: SnacStreamDecoder, frames: int) -> float:
    """Streamed vs offline on the device, one frame per push: SNR in dB."""
    rng = random.Random(1)
    codes = [_frame(rng) for _ in range(frames)]
    stream = SnacStream(decoder, seed=7)
    got = np.concatenate([*(stream.push([f]) for f in codes), stream.finish()])
    ref = decode_offline(model, codes, decoder.noise, seed=7).astype(np.float64)
    err = float(np.sum((ref - got) ** 2))
    return round(float(10 * np.log10(np.sum(ref**2) / max(err, 1e-30))), 1)


def check_graph(decoder: SnacStreamDecoder, streams: int = 8, ticks: int = 6) -> float:
    """A graphed batch against an eager one fed the same frames: max |diff|."""
    rng = random.Random(4)
    frames = [[_frame(rng) for _ in range(streams)] for _ in range(3 + ticks)]
    eager, graphed = SnacBatch(decoder), SnacBatch(decoder)
    for batch in (eager, graphed):
        batch.join_many([(k, 10 + k) for k in range(streams)])
        for tick in frames[:3]:
            batch.step({k: [f] for k, f in enumerate(tick)})
    tick_graph = GraphedTick(graphed)
    worst = 0.0
    for tick in frames[3:]:
        a = eager.step({k: [f] for k, f in enumerate(tick)})
        b = tick_graph.step(tick)
        worst = max(worst, max(float(np.abs(a[k] - b[k]).max()) for k in range(streams)))
    return worst


def first_frame(decoder: SnacStreamDecoder) -> dict[str, float]:
    """A new stream's first frame and first audio, pushed on its own (the
    engine serves a new utterance's first frame ahead of the batch)."""
    rng = random.Random(2)
    # shapes warm: a batch of this size has run, and a lone stream too
    warm = SnacStream(decoder)
    for _ in range(4):
        warm.push([_frame(rng)])
    stream = SnacStream(decoder, seed=3)
    times = []
    produced = 0
    t0 = time.perf_counter()
    for _ in range(3):
        start = time.perf_counter()
        produced += stream.push([_frame(rng)]).shape[0]
        _sync(decoder.device)
        times.append(1000 * (time.perf_counter() - start))
    first_audio = 1000 * (time.perf_counter() - t0)
    assert produced > 0
    return {
        "first_frame_decode_ms": round(times[0], 2),
        "first_audio_decode_ms_3_frames": round(first_audio, 2),
        "first_audio_samples": produced,
    }


def run_batch(
    decoder: SnacStreamDecoder, streams: int, ticks: int, warm: int, graphs: bool = False
) -> dict[str, Any]:
    rng = random.Random(streams)
    batch = SnacBatch(decoder)
    batch.join_many([(key, key) for key in range(streams)])
    # past the look-ahead warm-up (3 frames), as most streams of a live server are
    for _ in range(3):
        batch.step({k: [_frame(rng)] for k in range(streams)})
    graphed = GraphedTick(batch) if graphs else None
    times = []
    gpu_times = []
    cuda = decoder.device.type == "cuda"
    for tick in range(warm + ticks):
        new = [_frame(rng) for _ in range(streams)]
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        start = time.perf_counter()
        # both return host arrays: the copy back is included
        out = graphed.step(new) if graphed else batch.step({k: [f] for k, f in enumerate(new)})
        elapsed = 1000 * (time.perf_counter() - start)
        if cuda:
            end.record()
            end.synchronize()
            gpu = begin.elapsed_time(end)
        assert len(out) == streams
        if tick >= warm:
            times.append(elapsed)
            if cuda:
                gpu_times.append(gpu)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    mean = statistics.fmean(times)
    line: dict[str, Any] = {
        "mode": "cuda_graph" if graphs else "eager",
        "streams": streams,
        "ticks": ticks,
        "tick_ms_p50": round(statistics.median(times), 2),
        "tick_ms_p95": round(p95, 2),
        "tick_ms_mean": round(mean, 2),
        "real_time_factor": round(mean / FRAME_MS, 3),
        "audio_s_per_s": round(streams * FRAME_MS / mean, 1),
    }
    if gpu_times:
        line["gpu_ms_median"] = round(statistics.median(gpu_times), 2)
    return line


def ladder(max_streams: int) -> list[int]:
    steps = [1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512]
    steps += list(range(640, max_streams + 1, 128))
    return [n for n in steps if n <= max_streams] or [max_streams]


def machine(device: torch.device) -> dict[str, Any]:
    versions = {}
    for name in ("torch", "snac", "numpy"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    info: dict[str, Any] = {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "device": str(device),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "torch_threads": torch.get_num_threads(),
        "versions": versions,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-streams", type=int, default=1024)
    parser.add_argument("--ticks", type=int, default=40, help="timed ticks per N")
    parser.add_argument("--warm", type=int, default=5, help="untimed ticks per N")
    parser.add_argument("--p95-ms", type=float, default=20.0)
    parser.add_argument("--check-frames", type=int, default=12)
    parser.add_argument("--budget-s", type=float, default=300, help="stop the ladder after this")
    parser.add_argument("--noise", choices=("keyed", "off"), default="keyed")
    parser.add_argument(
        "--compile-snake", action="store_true", help="torch.compile the snake activation"
    )
    parser.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN pick kernels")
    parser.add_argument("--eager-only", action="store_true", help="no CUDA graph ladder")
    parser.add_argument(
        "--full-ladder", action="store_true", help="climb to --max-streams even past the limit"
    )
    args = parser.parse_args()
    started = time.monotonic()
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    if args.compile_snake:
        # one fused kernel instead of four passes; dynamic shapes: one compile
        # serves every layer and batch size (compiled in the warm-up ticks)
        snac_stream._snake = torch.compile(snac_stream._snake, dynamic=True)  # type: ignore[assignment]
    torch.manual_seed(0)
    model = build_snac_24khz().to(device)
    decoder = SnacStreamDecoder(model, device, noise=args.noise)
    print(json.dumps({**machine(device), "compiled_snake": args.compile_snake}), flush=True)
    snr = check_exact(model, decoder, args.check_frames)
    print(json.dumps({"check": "streamed_vs_offline", "frames": args.check_frames, "snr_db": snr}))
    modes = [False, True] if device.type == "cuda" and not args.eager_only else [False]
    if True in modes:
        diff = check_graph(decoder)
        print(json.dumps({"check": "cuda_graph_vs_eager", "max_abs_diff": diff}), flush=True)
    best = dict.fromkeys(("eager", "cuda_graph"), 0)
    stopped = None
    for graphs in modes:
        mode = "cuda_graph" if graphs else "eager"
        for streams in ladder(args.max_streams):
            line = run_batch(decoder, streams, args.ticks, args.warm, graphs)
            ok = line["tick_ms_p95"] <= args.p95_ms and line["tick_ms_mean"] < FRAME_MS
            line["ok"] = ok
            print(json.dumps(line), flush=True)
            if ok:
                best[mode] = streams
            elif not args.full_ladder and line["tick_ms_p95"] > 2 * max(args.p95_ms, FRAME_MS):
                stopped = "p95 far past the limit"
                break
            if time.monotonic() - started > args.budget_s:
                stopped = "time budget"
                break
        if stopped == "time budget":
            break
    summary: dict[str, Any] = {
        "summary": True,
        "largest_streams_real_time_p95_ok": best["eager"],
        "largest_streams_real_time_p95_ok_cuda_graph": best["cuda_graph"]
        if True in modes
        else None,
        "p95_limit_ms": args.p95_ms,
        "frame_ms": round(FRAME_MS, 2),
        "lookahead_samples": decoder.lookahead_samples,
        "snr_db": snr,
        "ladder_stopped": stopped,
        "elapsed_s": round(time.monotonic() - started, 1),
        **first_frame(decoder),
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
