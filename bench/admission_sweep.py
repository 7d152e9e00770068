"""Default admission against fixed door sizes, and against older commits, in
one sitting: the capacity ladder for each variant, runs rotating.

Issue 27's targets compare the default (automatic) door with the best fixed
``max_active_streams`` measured in the same minutes, and the conversations
held with the start probe's real-time streams (the "cost" ratio).  This
machine drifts between phases, so each run measures every variant once, the
order rotating from run to run (and reversed every other run), and the
closing line takes medians:

    .venv/bin/python bench/admission_sweep.py --runs 3 \\
        --variant default=HEAD --fixed 4,8,12,16,20 \\
        --variant main=aa559da \\
        --out bench/results/admission_sweep.jsonl

A variant is ``LABEL=COMMIT`` with optional ``:KEY=VALUE,...`` environment;
``--fixed N,...`` adds ``fixedN=<commit of the first variant>:
GATEWAY_MAX_ACTIVE_STREAMS=N`` for each N.  Extra harness arguments follow
``--`` (default: the LLM-paced ladder 2..20).  Each commit is checked out
once into a detached worktree; every run uses this checkout's virtualenv.
Each run's harness output (``label-run.jsonl``, every utterance and
session, and its HTML report) is kept in ``<out stem>_runs/``, and the
server's log in ``<out stem>_logs/``.
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

from ab_compare import git, summarize

SERVER_LOG = Path(tempfile.gettempdir()) / "gateway-bench-logs" / "gateway.log"
DEFAULT_BENCH = [
    "--scenarios",
    "capacity",
    "--levels",
    "2,4,6,8,10,12,16,20",
    "--capacity-pacing",
    "llm",
]


def parse_variant(spec: str) -> tuple[str, str, dict[str, str]]:
    """``LABEL=COMMIT[:KEY=VALUE,...]`` -> (label, commit, env)."""
    label, _, rest = spec.partition("=")
    commit, _, env_spec = rest.partition(":")
    env = dict(item.split("=", 1) for item in env_spec.split(",") if item)
    if not label or not commit:
        raise SystemExit(f"a variant is LABEL=COMMIT[:KEY=VALUE,...], not {spec!r}")
    return label, commit, env


def order(labels: list[str], run: int) -> list[str]:
    """Run ``run``'s order: rotated by the run, reversed every other run, so
    each variant takes each place in turn."""
    shift = run % len(labels)
    rotated = labels[shift:] + labels[:shift]
    return rotated if run % 2 == 0 else rotated[::-1]


def closing(rows: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    """Medians per variant, the best fixed door and the two ratios."""
    out: dict[str, Any] = {"kind": "sweep_median", "variants": {}}
    # a run's probe: the machine's speed in that run's minutes (a fixed door
    # and an older commit run no probe of their own)
    run_probe = {r["run"]: r["probe_realtime_streams"] for r in rows if r["probe_realtime_streams"]}
    for label in labels:
        mine = [r for r in rows if r["label"] == label]
        held = [r["capacity_held"] or 0 for r in mine]
        # a variant's own probe where it ran one, else its run's
        own = [r["probe_realtime_streams"] or run_probe.get(r["run"]) for r in mine]
        probes = [p for p in own if p]
        costs = [(r["capacity_held"] or 0) / p for r, p in zip(mine, own, strict=True) if p]
        out["variants"][label] = {
            "commit": mine[0]["commit"],
            "env": mine[0]["env"],
            "held": held,
            "held_median": statistics.median(held),
            "held_600ms": [r["held_600ms"] for r in mine],
            "probe_median": statistics.median(probes) if probes else None,
            "cost_median": round(statistics.median(costs), 3) if costs else None,
        }
    fixed = {k: v for k, v in out["variants"].items() if k.startswith("fixed")}
    if fixed and "default" in out["variants"]:
        best = max(fixed, key=lambda k: fixed[k]["held_median"])
        best_held = fixed[best]["held_median"]
        out["best_fixed"] = best
        out["default_over_best_fixed"] = (
            round(out["variants"]["default"]["held_median"] / best_held, 3) if best_held else None
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=COMMIT[:ENV]")
    parser.add_argument("--fixed", default="", help="fixed door sizes, e.g. 4,8,12,16,20")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/admission_sweep.jsonl"))
    parser.add_argument("bench", nargs="*", help="harness arguments (after --)")
    args = parser.parse_args()
    variants = [parse_variant(v) for v in args.variant or ["default=HEAD"]]
    first_commit = variants[0][1]
    for n in filter(None, args.fixed.split(",")):
        variants.append((f"fixed{n}", first_commit, {"GATEWAY_MAX_ACTIVE_STREAMS": n}))
    bench_args = args.bench or DEFAULT_BENCH
    repo = Path(git("rev-parse", "--show-toplevel"))
    commits = {label: git("rev-parse", commit) for label, commit, _ in variants}
    envs = {label: env for label, _, env in variants}
    labels = [label for label, _, _ in variants]
    rows: list[dict[str, Any]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs = args.out.with_name(args.out.stem + "_runs")
    logs = args.out.with_name(args.out.stem + "_logs")
    runs.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="admission-sweep-") as tmp:
        trees: dict[str, Path] = {}
        for sha in sorted(set(commits.values())):
            tree = Path(tmp) / sha[:12]
            git("worktree", "add", "--detach", str(tree), sha, cwd=repo)
            trees[sha] = tree
        try:
            with args.out.open("w") as fh:
                for run in range(args.runs):
                    for label in order(labels, run):
                        out = runs / f"{label}-{run}.jsonl"
                        command = [sys.executable, "-m", "gateway", "bench", *bench_args]
                        command += ["--out", str(out), "--report", str(out.with_suffix(".html"))]
                        env = {**os.environ, **envs[label]}
                        subprocess.run(command, cwd=trees[commits[label]], check=True, env=env)
                        row: dict[str, Any] = {
                            "kind": "sweep_run",
                            "label": label,
                            "commit": commits[label],
                            "env": envs[label],
                            "run": run,
                        }
                        row.update(summarize(out))
                        row.update(_capacity_extras(out))
                        if SERVER_LOG.exists():  # the door's decisions, for reading later
                            shutil.copy(SERVER_LOG, logs / f"{label}-{run}.log")
                        rows.append(row)
                        fh.write(json.dumps(row) + "\n")
                        fh.flush()
                        print(json.dumps(row), flush=True)
                final = closing(rows, labels)
                final["bench_args"] = bench_args
                fh.write(json.dumps(final) + "\n")
                print(json.dumps(final), flush=True)
        finally:
            for tree in trees.values():
                git("worktree", "remove", "--force", str(tree), cwd=repo)


def _capacity_extras(path: Path) -> dict[str, Any]:
    """The ladder's 600 ms figure and the start probe (absent on old commits)."""
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "capacity" and row.get("target") == "gateway":
            return {
                "held_600ms": (row.get("held_by_ttfa_ms") or {}).get("600"),
                "probe_realtime_streams": row.get("probe_realtime_streams"),
            }
    return {"held_600ms": None, "probe_realtime_streams": None}


if __name__ == "__main__":
    main()
