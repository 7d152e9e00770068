"""Compare two commits with the harness in one sitting, runs alternating.

This machine is noisy and drifts between faster and slower phases, so an
old/new comparison is only fair when both commits are measured in the same
minutes: this script checks each commit out into a detached git worktree,
runs ``python -m gateway bench`` from each in turn (old, new, new, old, old,
new, ...: the order alternates, since the second of a pair tends to measure
slower), and prints one JSON line per run plus a closing line with the medians.

    .venv/bin/python bench/ab_compare.py --old 6d54e2c --new HEAD --runs 3 \
        --out bench/results/ab_compare.jsonl

Both commits run with this checkout's virtualenv (``sys.executable``); the
harness starts each server from its own worktree, so each serves its own
code.  Extra harness arguments follow ``--``; the default workload is the
flushed-sentence scenario plus the flushed-paragraph capacity steps.

``--old-env`` / ``--new-env KEY=VALUE`` (repeatable) set the environment of
one side's runs, so one commit can be compared with two settings, e.g. fixed
against automatic admission:

    .venv/bin/python bench/ab_compare.py --old HEAD --new HEAD \
        --old-env GATEWAY_MAX_ACTIVE_STREAMS=20 --runs 3 \
        --out bench/results/ab_admission.jsonl -- --scenarios overload

The worktrees and each run's harness lines are removed at the end; ``--keep
DIR`` copies each run's lines there first (``old-0.jsonl``, ``new-0.jsonl``,
...).  The hostile scenario's verdict (RSS growth, gaps, first audio) is in
each run's summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_BENCH = [
    "--scenarios",
    "flush,capacity",
    "--utterances",
    "20",
    "--capacity-pacing",
    "flush",
    "--levels",
    "1,2,3,4,5,6,8",
]


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def summarize(path: Path) -> dict[str, Any]:
    """The figures compared: flush and llm time to first audio, capacity,
    overload, and per http-load level its TTFP and failed requests."""
    flush: dict[str, Any] = {}
    llm: dict[str, Any] = {}
    llm_gaps: list[float] = []
    held: int | None = None
    steps: list[dict[str, Any]] = []
    overload: dict[str, Any] = {}
    http: dict[str, Any] = {}
    hostile: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "hostile_verdict":  # the scenario's lines name no target
            hostile = row
        if row.get("target") != "gateway":
            continue
        kind, scenario = row.get("kind"), row.get("scenario")
        if kind == "summary" and scenario == "flush":
            flush = row["ttfa_flush_ms"]
        if kind == "summary" and scenario == "llm":
            llm = row["ttfa_first_token_ms"]
        if kind == "utterance" and scenario == "llm":
            llm_gaps.append(row["max_gap_ms"])
        if kind == "capacity":
            held = row["held_level"]
            steps = row["steps"]
        if kind == "overload":
            overload = row
        if kind == "http_load":
            level = f"http_x{row['level']}"
            http[f"{level}_ttfp_p50_ms"] = row["ttfp_ms"].get("p50")
            http[f"{level}_ttfp_p99_ms"] = row["ttfp_ms"].get("p99")
            http[f"{level}_failed"] = row["failed"]
    return {
        "flush_ttfa_p50_ms": flush.get("p50"),
        "flush_ttfa_p95_ms": flush.get("p95"),
        # a gap is a frame more than 100 ms late (gateway/bench/measure.py)
        "llm_utterances_with_gap": sum(g > 100 for g in llm_gaps) if llm_gaps else None,
        "llm_max_gap_ms": max(llm_gaps) if llm_gaps else None,
        "llm_ttfa_first_token_p50_ms": llm.get("p50"),
        "llm_ttfa_first_token_p95_ms": llm.get("p95"),
        "capacity_held": held,
        "capacity_steps": steps,
        "overload_admitted": overload.get("admitted"),
        "overload_admitted_with_gap": overload.get("admitted_with_gap"),
        "overload_busy": overload.get("busy"),
        "overload_busy_answered_max_ms": (
            overload.get("busy_answered_after_first_text_ms") or {}
        ).get("max"),
        "overload_busy_queue_waited_max_ms": (overload.get("busy_queue_waited_ms") or {}).get(
            "max"
        ),
        "overload_other_errors": overload.get("other_errors"),
        "overload_rss_mib": overload.get("rss_mib"),
        "hostile_rss_growth_mib": hostile.get("rss_growth_mib"),
        "hostile_rss_ok": hostile.get("rss_ok"),
        "hostile_gap_ok": hostile.get("gap_ok"),
        "hostile_first_audio_p95_ms": (hostile.get("canary_first_audio_p95_ms") or {}).get(
            "hostile"
        ),
        **http,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the commit before the change")
    parser.add_argument("--new", default="HEAD", help="the commit with the change")
    parser.add_argument("--runs", type=int, default=3, help="runs of each commit")
    parser.add_argument("--out", type=Path, default=Path("bench/results/ab_compare.jsonl"))
    for label in ("old", "new"):
        parser.add_argument(
            f"--{label}-env",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"environment of the {label} side's runs (repeatable)",
        )
    parser.add_argument(
        "--keep",
        type=Path,
        help="copy each run's harness lines here (<label>-<run>.jsonl) before the"
        " temporary worktrees and their files are removed",
    )
    parser.add_argument("bench", nargs="*", help="harness arguments (after --)")
    args = parser.parse_args()
    bench_args = args.bench or DEFAULT_BENCH
    repo = Path(git("rev-parse", "--show-toplevel"))
    commits = {"old": git("rev-parse", args.old), "new": git("rev-parse", args.new)}
    envs = {
        label: dict(item.split("=", 1) for item in getattr(args, f"{label}_env"))
        for label in commits
    }
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ab-compare-") as tmp:
        trees = {}
        for label, commit in commits.items():
            tree = Path(tmp) / label
            git("worktree", "add", "--detach", str(tree), commit, cwd=repo)
            trees[label] = tree
        try:
            for run in range(args.runs):
                # the order alternates: the second of a pair measured slower
                # more often than not, whichever commit it was (round 8)
                for label in ("old", "new") if run % 2 == 0 else ("new", "old"):
                    out = Path(tmp) / f"{label}-{run}.jsonl"
                    command = [sys.executable, "-m", "gateway", "bench", *bench_args]
                    command += ["--out", str(out), "--report", str(out.with_suffix(".html"))]
                    env = {**os.environ, **envs[label]}
                    subprocess.run(command, cwd=trees[label], check=True, env=env)
                    if args.keep is not None:
                        args.keep.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(out, args.keep / out.name)
                    row = {
                        "kind": "ab_run",
                        "label": label,
                        "commit": commits[label],
                        "env": envs[label],
                        "run": run,
                    }
                    row.update(summarize(out))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            for tree in trees.values():
                git("worktree", "remove", "--force", str(tree), cwd=repo)
    closing: dict[str, Any] = {"kind": "ab_median", "bench_args": bench_args}
    for label in ("old", "new"):
        mine = [r for r in rows if r["label"] == label]
        closing[label] = {"commit": commits[label], "env": envs[label]}
        for key in mine[0]:
            values = [r[key] for r in mine]
            if key != "run" and all(isinstance(v, int | float) for v in values):
                closing[label][key] = statistics.median(values)
    print(json.dumps(closing), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as fh:
        for row in [*rows, closing]:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
