"""Soak: does the server's memory stay flat under a long LLM-paced load?

    .venv/bin/python bench/soak.py                       # 500 utterances, 4 sessions
    .venv/bin/python bench/soak.py --utterances 40 --warmup-utterances 10   # a smoke run

Starts ``python -m gateway serve`` on a free loopback port (the real server,
default engine) and opens ``--sessions`` WebSocket sessions at 48 kHz
(``pcm``, ``stream_audio``, 20 ms frames: the resampler runs on every frame).
Each session speaks replies from the harness corpus one after another, as
LLM tokens at ``--token-rate`` per second (±50% jitter, seeded), and reads
its audio as a normal client does, until ``--utterances`` replies are done
over all sessions.  Meanwhile the server's RSS (``/proc/PID/status``
``VmRSS``) is sampled every ``--sample-s`` seconds.

Output (JSON lines on stdout and in ``--out``): a ``run`` line (machine,
versions, settings), ``rss`` samples (elapsed seconds, utterances done, MiB),
and a ``summary``: idle RSS before the load, RSS when the warm-up
utterances were done and at the end, the growth between the two (the target
is <= 10 MiB after the first 50), the same growth from the medians of the
samples taken over the first and last tenth of the measured utterances
(less sensitive to where a sample lands in the allocator's cycle), the
median of the samples after the warm-up (what the load costs: compare runs
with different ``--sessions``), the peak, and RSS again once idle (3 s after
the last utterance, when the server has returned its free heap).  Not in CI: it takes about
``utterances / sessions * 15 s`` (500 utterances: about half an hour).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway.bench import corpus
from gateway.bench.measure import tokenize
from gateway.bench.runner import free_port, gateway_command, machine_info, started
from gateway.client import AudioFrame, Client
from gateway.protocol import Error, SessionConfig, SessionDone

CONFIG = SessionConfig(response_format="pcm", stream_audio=True, frame_ms=20, sample_rate=48000)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc status (Linux only)")


class Load:
    """The sessions and the shared count of finished utterances."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url = url
        self.args = args
        self.done = 0
        self.errors = 0
        self.audio_s = 0.0
        self.milestones: dict[int, float] = {}  #: utterances done -> RSS then
        self._next = 0

    def take(self) -> int | None:
        """The next utterance number, or None once all are handed out."""
        if self._next >= self.args.utterances:
            return None
        self._next += 1
        return self._next - 1

    async def session(self, index: int) -> None:
        rng = random.Random(f"{self.args.seed}:soak:{index}")
        base = 1 / self.args.token_rate
        async with await Client.connect(self.url, CONFIG) as client:
            while (number := self.take()) is not None:
                text = corpus.PARAGRAPHS[number % len(corpus.PARAGRAPHS)]

                async def send(tokens: list[str]) -> None:
                    for token in tokens:
                        await client.send_text(token)
                        await asyncio.sleep(base * (1 + rng.uniform(-0.5, 0.5)))
                    await client.done()

                sender = asyncio.create_task(send(tokenize(text)))
                async for event in client.events():
                    if isinstance(event, AudioFrame):
                        self.audio_s += len(event.data) / 2 / event.sample_rate
                    elif isinstance(event, Error):
                        self.errors += 1
                    elif isinstance(event, SessionDone):
                        break
                await sender
                self.done += 1


def git_commit() -> str | None:
    """The commit measured (None outside a git checkout)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def emit(line: dict[str, Any], out: Any) -> None:
    text = json.dumps(line)
    print(text, flush=True)
    if out is not None:
        out.write(text + "\n")
        out.flush()


async def soak(url: str, pid: int, args: argparse.Namespace, out: Any) -> dict[str, Any]:
    idle_before = rss_mib(pid)
    load = Load(url, args)
    samples: list[tuple[float, int, float]] = []
    t0 = time.monotonic()

    async def sampler() -> None:
        while True:
            sample = (round(time.monotonic() - t0, 2), load.done, round(rss_mib(pid), 1))
            samples.append(sample)
            emit({"kind": "rss", "elapsed_s": sample[0], "done": sample[1], "mib": sample[2]}, out)
            await asyncio.sleep(args.sample_s)

    def on_done_watch() -> None:
        # RSS the moment the warm-up count and the last utterance are reached
        for mark in (args.warmup_utterances, args.utterances):
            if load.done >= mark and mark not in load.milestones:
                load.milestones[mark] = rss_mib(pid)

    async def watcher() -> None:
        while True:
            on_done_watch()
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(sampler()), asyncio.create_task(watcher())]
    try:
        await asyncio.gather(*(load.session(i) for i in range(args.sessions)))
    finally:
        on_done_watch()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # the server trims its heap about a second after its last job (gateway/ops/heap.py)
    await asyncio.sleep(3.0)
    idle_after = rss_mib(pid)

    measured = [s for s in samples if s[1] >= args.warmup_utterances]
    span = args.utterances - args.warmup_utterances
    tenth = max(1, span // 10)
    early = [s[2] for s in measured if s[1] < args.warmup_utterances + tenth]
    late = [s[2] for s in measured if s[1] >= args.utterances - tenth]
    at_warm = load.milestones.get(args.warmup_utterances)
    at_end = load.milestones.get(args.utterances)
    growth = None if at_warm is None or at_end is None else round(at_end - at_warm, 1)
    return {
        "kind": "summary",
        "utterances": load.done,
        "sessions": args.sessions,
        "errors": load.errors,
        "audio_s": round(load.audio_s, 1),
        "wall_s": round(time.monotonic() - t0, 1),
        "rss_idle_before_mib": round(idle_before, 1),
        "rss_after_warmup_mib": None if at_warm is None else round(at_warm, 1),
        "rss_end_mib": None if at_end is None else round(at_end, 1),
        "growth_after_warmup_mib": growth,
        "growth_median_mib": (
            round(statistics.median(late) - statistics.median(early), 1) if early and late else None
        ),
        "rss_load_median_mib": (
            round(statistics.median(s[2] for s in measured), 1) if measured else None
        ),
        "rss_peak_mib": max((s[2] for s in samples), default=None),
        "rss_idle_after_mib": round(idle_after, 1),
        "target_growth_mib": args.target_mib,
        "target_met": growth is not None and growth <= args.target_mib,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--utterances", type=int, default=500)
    parser.add_argument("--warmup-utterances", type=int, default=50)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--token-rate", type=float, default=20.0)
    parser.add_argument("--sample-s", type=float, default=1.0)
    parser.add_argument("--target-mib", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="bench/results/soak.jsonl")
    args = parser.parse_args()
    if not 0 < args.warmup_utterances < args.utterances:
        parser.error("need 0 < --warmup-utterances < --utterances")
    if sys.platform != "linux":
        parser.error("RSS is read from /proc: Linux only")
    out_path = Path(args.out) if args.out else None
    out = None
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out = out_path.open("w", encoding="utf-8")
    emit(
        {
            "kind": "run",
            "machine": machine_info(),
            "commit": git_commit(),
            "python": platform.python_version(),
            "settings": vars(args),
            "config": {"sample_rate": 48000, "frame_ms": 20, "stream_audio": True},
        },
        out,
    )
    port = free_port()
    log = Path(tempfile.gettempdir()) / "gateway-soak.log"
    try:
        with started(gateway_command(port), f"http://127.0.0.1:{port}/readyz", log) as proc:
            url = f"ws://127.0.0.1:{port}/v1/audio/speech/stream"
            summary = asyncio.run(soak(url, proc.pid, args, out))
        emit(summary, out)
    finally:
        if out is not None:
            out.close()
    return 0 if summary["errors"] == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    sys.exit(main())
