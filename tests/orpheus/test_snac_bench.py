"""The SNAC benchmarks run (tiny sizes, CPU): they stay usable for the next
time a quiet machine or a GPU is at hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("snac")

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_gpu_bench_smoke_mode_on_cpu() -> None:
    lines = _run(
        "bench/snac_gpu_bench.py",
        "--device",
        "cpu",
        "--max-streams",
        "2",
        "--ticks",
        "2",
        "--warm",
        "1",
        "--check-frames",
        "4",
        "--full-ladder",
    )
    assert lines[0]["device"] == "cpu"
    assert lines[1]["check"] == "streamed_vs_offline" and float(lines[1]["snr_db"]) >= 60  # type: ignore[arg-type]
    assert [line["streams"] for line in lines[2:-1]] == [1, 2]
    summary = lines[-1]
    assert summary["summary"] is True
    assert summary["lookahead_samples"] == 4757
    assert summary["first_audio_samples"] == 3 * 2048 - 4757
    assert float(summary["first_frame_decode_ms"]) > 0  # type: ignore[arg-type]


def test_cpu_bench_runs() -> None:
    lines = _run("bench/snac_bench.py", "--frames", "5", "--warm", "0")
    assert [line.get("method") for line in lines[:2]] == ["carried_state", "sliding_window_4"]
    assert lines[0]["frames_timed"] == 5 and lines[1]["frames_timed"] == 2
    assert lines[2]["cpus"]
