"""SNAC 24 kHz decode per new Orpheus frame: carried state vs the sliding window.

The usual recipe (Orpheus' reference decoder) decodes a window of the last 4
frames (28 tokens) with ``SNAC.decode`` for every new frame and keeps the
2nd frame's 2048 samples: 4 frames of work per frame, and not exact (its
right context is shorter than the decoder's look-ahead).  The carried-state
decoder (``gateway.vocoders.snac_stream``) pushes each frame once.

A seeded random-weight SNAC with the 24 kHz configuration: the compute is the
architecture's, the weights do not change it; nothing is downloaded.  One
frame is 85.33 ms of audio, so ``ms_per_frame`` under 85.33 is faster than
real time.  Prints one JSON line per method, then one with the machine.

    PYTHONPATH=. python bench/snac_bench.py [--frames 24] [--threads 2]
"""

from __future__ import annotations

import os

# before torch loads: idle OpenMP threads must not spin on a shared 2-core
# machine (the gateway sets the same in gateway/vocoders/__init__.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import contextlib
import importlib.metadata
import json
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from gateway.vocoders.snac_stream import SnacStream, SnacStreamDecoder, build_snac_24khz

FRAME_MS = 2048 / 24000 * 1000


def _frames(n: int) -> list[tuple[int, ...]]:
    rng = random.Random(0)
    return [tuple(rng.randrange(4096) for _ in range(7)) for _ in range(n)]


def _summary(name: str, wall: list[float], cpu: list[float], **extra: Any) -> dict[str, Any]:
    wall_ms = sorted(1000 * w for w in wall)
    return {
        "method": name,
        "frames_timed": len(wall),
        "ms_per_frame_median": round(statistics.median(wall_ms), 2),
        "ms_per_frame_p95": round(wall_ms[int(0.95 * (len(wall_ms) - 1))], 2),
        "cpu_ms_per_frame_median": round(1000 * statistics.median(cpu), 2),
        "real_time_factor_median": round(statistics.median(wall_ms) / FRAME_MS, 3),
        **extra,
    }


def carried(decoder: SnacStreamDecoder, frames: list[tuple[int, ...]], warm: int) -> dict[str, Any]:
    stream = SnacStream(decoder, seed=0)
    wall: list[float] = []
    cpu: list[float] = []
    for i, frame in enumerate(frames):
        t0, c0 = time.perf_counter(), time.process_time()
        stream.push([frame])
        if i >= warm:
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    stream.finish()
    return _summary(
        "carried_state", wall, cpu, lookahead_samples=decoder.lookahead_samples, exact=True
    )


def sliding_window(model: Any, frames: list[tuple[int, ...]], warm: int) -> dict[str, Any]:
    wall: list[float] = []
    cpu: list[float] = []
    for i in range(4, len(frames) + 1):
        window = frames[i - 4 : i]
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            codes = [
                torch.tensor([[f[p] for f in window for p in ps]])
                for ps in ((0,), (1, 4), (2, 3, 5, 6))
            ]
            audio = model.decode(codes)[0, 0, 2048:4096].numpy()
        assert audio.shape == (2048,)
        if i - 4 >= warm:
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return _summary("sliding_window_4", wall, cpu, window_frames=4, exact=False)


def machine() -> dict[str, Any]:
    versions = {}
    for name in ("torch", "snac", "numpy"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "versions": versions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=24, help="frames decoded per method")
    parser.add_argument("--warm", type=int, default=3, help="first frames not timed")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_snac_24khz()
    decoder = SnacStreamDecoder(model, torch.device("cpu"), noise="keyed")
    frames = _frames(args.frames)
    start = machine()
    for line in (carried(decoder, frames, args.warm), sliding_window(model, frames, args.warm)):
        print(json.dumps(line), flush=True)
    info = machine()
    info["loadavg_1m_at_start"] = start["loadavg_1m"]
    print(json.dumps(info), flush=True)


if __name__ == "__main__":
    main()
