"""Batched carried-state HiFi-GAN steps against one push per stream (CPU).

What it measures: N streams of the bundled voice at steady state (each has
had its first chunk, 16 frames + the 11-frame lookahead, and its second, 32
frames), then one step of ``--frames`` latent frames (the schedule's steady
chunk, 64) for every stream, done two ways on two identical sets of streams:

- ``single``: N ``DecoderStream.push`` calls, one after another (what the
  decode worker does now);
- ``batched``: one ``stateful.push_batch`` of the N streams.

The two are interleaved within each repetition (which goes first alternates),
so a shared, drifting machine affects both alike.  Each repetition builds
fresh streams from real latents (the benchmark paragraph through the real
phonemizer, encoder and flow, each stream starting at another frame), and
its first step of each shape is not timed (oneDNN compiles per shape).  The
batched output is compared with the single one (max abs difference).

Prints one JSON line per (threads, N): p50/p95 of each way in wall ms and in
process CPU ms (``time.process_time``, all threads: what a step costs the
machine's cores, and much less disturbed than wall time by other processes
on a shared machine), the wall speed-up (single p50 / batched p50), the CPU
saving, the audio seconds per second of each way, and the difference.

    PYTHONPATH=. .venv/bin/python bench/vocoder_batch.py --streams 2,4,8,16 --threads 1,2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

from gateway.engines.piper import PiperEngine
from gateway.engines.piper.settings import PiperSettings
from gateway.engines.piper.voice import LoadedVoice
from gateway.settings import Settings
from gateway.vocoders.stateful import DecoderStream, push_batch

TEXT = (
    "The quick brown fox jumped over the lazy dog while the curious cat watched quietly. "
    "Streaming speech should start fast, and it should never stop for a breath it did not take. "
    "On the third of May, the ship left the harbour at dawn with forty-two passengers aboard."
)


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return round(statistics.median(ordered), 2), round(p95, 2)


def latent_of(voice: LoadedVoice, text: str) -> np.ndarray:
    ids = voice.phonemizer.phonemes_to_ids(voice.phonemize(text))
    encoded = voice.acoustic.encode(ids, voice.scales(1.0, deterministic=True))
    return voice.acoustic.flow_whole(encoded)


def rows(latent: np.ndarray, start: int, count: int) -> torch.Tensor:
    """Frames ``[start, start + count)`` time-major, wrapping around."""
    index = np.arange(start, start + count) % latent.shape[1]
    return torch.from_numpy(np.ascontiguousarray(latent[:, index].T))


def steady_streams(
    voice: LoadedVoice, latent: np.ndarray, n: int, offset: int, lookahead: int
) -> tuple[list[DecoderStream], list[int]]:
    assert voice.vocoder is not None
    streams, positions = [], []
    for b in range(n):
        stream = DecoderStream(voice.vocoder.model)
        start = offset + 37 * b
        first = 16 + lookahead
        stream.push(rows(latent, start, first))
        stream.push(rows(latent, start + first, 32))
        streams.append(stream)
        positions.append(start + first + 32)
    return streams, positions


def step_inputs(latent: np.ndarray, positions: list[int], frames: int) -> torch.Tensor:
    return torch.stack([rows(latent, p, frames) for p in positions])


def measure(
    voice: LoadedVoice, latent: np.ndarray, n: int, frames: int, reps: int
) -> dict[str, Any]:
    assert voice.vocoder is not None
    lookahead = voice.vocoder.lookahead_frames
    single_ms: list[float] = []
    batched_ms: list[float] = []
    single_cpu: list[float] = []
    batched_cpu: list[float] = []
    diff = 0.0
    with torch.inference_mode():
        for rep in range(reps + 1):
            offset = 101 * rep
            a, positions = steady_streams(voice, latent, n, offset, lookahead)
            b, _ = steady_streams(voice, latent, n, offset, lookahead)
            x = step_inputs(latent, positions, frames)
            outputs: dict[str, list[torch.Tensor]] = {}
            order = ("single", "batched") if rep % 2 == 0 else ("batched", "single")
            for way in order:
                t0 = time.perf_counter()
                c0 = time.process_time()
                if way == "single":
                    outputs[way] = [s.push(x[i]) for i, s in enumerate(a)]
                else:
                    outputs[way] = list(push_batch(b, x))
                elapsed = (time.perf_counter() - t0) * 1e3
                cpu = (time.process_time() - c0) * 1e3
                if rep > 0:  # the first repetition compiles the shapes
                    (single_ms if way == "single" else batched_ms).append(elapsed)
                    (single_cpu if way == "single" else batched_cpu).append(cpu)
            diff = max(
                diff,
                max(
                    float((s - t).abs().max())
                    for s, t in zip(outputs["single"], outputs["batched"], strict=True)
                ),
            )
    audio_s = n * frames * voice.hop_length / voice.sample_rate
    s50, s95 = summary(single_ms)
    b50, b95 = summary(batched_ms)
    sc50, sc95 = summary(single_cpu)
    bc50, bc95 = summary(batched_cpu)
    return {
        "kind": "vocoder_batch",
        "threads": torch.get_num_threads(),
        "streams": n,
        "frames": frames,
        "reps": reps,
        "single_ms_p50": s50,
        "single_ms_p95": s95,
        "batched_ms_p50": b50,
        "batched_ms_p95": b95,
        "speedup_p50": round(s50 / b50, 3),
        "single_cpu_ms_p50": sc50,
        "single_cpu_ms_p95": sc95,
        "batched_cpu_ms_p50": bc50,
        "batched_cpu_ms_p95": bc95,
        "cpu_saving_p50": round(1 - bc50 / sc50, 3),
        "single_audio_s_per_s": round(audio_s / (s50 / 1e3), 1),
        "batched_audio_s_per_s": round(audio_s / (b50 / 1e3), 1),
        "max_abs_diff": diff,
    }


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="2,4,8,16")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--frames", type=int, default=64, help="latent frames per step")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    emit(
        {
            "kind": "machine",
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "commit": commit(),
            "load_avg": os.getloadavg(),
        }
    )
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(data_dir=data_dir, piper=PiperSettings(device="cpu"))
        engine = PiperEngine(settings)
        asyncio.run(engine.start())
        voice = engine.loaded_voice("joe")
        latent = latent_of(voice, TEXT)
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            for n in [int(s) for s in args.streams.split(",")]:
                emit(measure(voice, latent, n, args.frames, args.reps))
        asyncio.run(engine.aclose())
    emit({"kind": "end", "load_avg": os.getloadavg()})


if __name__ == "__main__":
    main()
