"""Measure the streaming resampler: added latency, quality and CPU cost.

Prints one JSON line per (input rate, output rate) pair, then one line with
the machine and library versions.  Latency is measured on the audio clock
(deterministic); only ``cpu_ms_per_s`` depends on the machine.

    PYTHONPATH=. python bench/audio_resampler.py [--chunk-ms 20]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import soxr

from gateway.audio.resample import QUALITY, StreamResampler


def _sweep(t: np.ndarray, f0: float, f1: float, duration: float) -> np.ndarray:
    k = np.log(f1 / f0)
    return np.asarray(0.5 * np.sin(2 * np.pi * f0 * duration / k * (np.exp(t / duration * k) - 1)))


def measure(in_rate: int, out_rate: int, chunk_ms: int, seconds: float = 4.0) -> dict[str, object]:
    n = int(seconds * in_rate)
    f1 = 0.42 * min(in_rate, out_rate)
    x = _sweep(np.arange(n) / in_rate, 50.0, f1, seconds).astype(np.float32)
    chunk = max(1, in_rate * chunk_ms // 1000)
    resampler = StreamResampler(in_rate, out_rate)
    delays: list[float] = []
    first_output_after_ms: float | None = None
    pieces = []
    start = time.process_time()
    for position in range(0, n, chunk):
        out = resampler.process(x[position : position + chunk])
        pieces.append(out)
        if len(out) and first_output_after_ms is None:
            first_output_after_ms = (position + chunk) * 1000 / in_rate
        delays.append(resampler.delay_ms)
    pieces.append(resampler.flush())
    cpu_s = time.process_time() - start
    y = np.concatenate(pieces)
    ideal = _sweep(np.arange(len(y)) / out_rate, 50.0, f1, seconds)
    edge = out_rate // 10
    inner = slice(edge, len(y) - edge)
    noise = np.sum((y[inner] - ideal[inner]) ** 2)
    snr_db = 10 * np.log10(np.sum(ideal[inner] ** 2) / max(noise, 1e-30))
    steady = delays[len(delays) // 4 :]
    return {
        "in_rate": in_rate,
        "out_rate": out_rate,
        "quality": QUALITY if in_rate != out_rate else "passthrough",
        "chunk_ms": chunk_ms,
        "holdback_mean_ms": round(float(np.mean(steady)), 2),
        "holdback_max_ms": round(float(max(delays)), 2),
        "first_output_after_ms": first_output_after_ms,
        "snr_vs_ideal_db": round(float(snr_db), 1),
        "cpu_ms_per_s": round(cpu_s * 1000 / seconds, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-ms", type=int, default=20)
    args = parser.parse_args()
    for in_rate in (22050, 16000):
        for out_rate in (8000, 16000, 22050, 24000, 44100, 48000):
            print(json.dumps(measure(in_rate, out_rate, args.chunk_ms)))
    print(
        json.dumps(
            {
                "machine": platform.machine(),
                "processor": platform.processor(),
                "python": platform.python_version(),
                "numpy": np.__version__,
                "soxr": soxr.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
