"""One line per sweep run of an ``admission_sweep.jsonl``: held steps, the
probe, the overload, and each ladder step (p95 first audio, underruns,
errors)."""

import json
import sys
from pathlib import Path


def step(s: dict) -> str:
    verdict = "ok" if s["held"] else "FAIL"
    return f"x{s['level']}:{verdict}({s['ttfa_p95_ms']:.0f},u{s['underruns']},e{s['errors']})"


for line in Path(sys.argv[1]).read_text().splitlines():
    r = json.loads(line)
    if r.get("kind") != "sweep_run":
        continue
    print(
        r["label"],
        r["run"],
        "held",
        r["capacity_held"],
        "h600",
        r.get("held_600ms"),
        "probe",
        r["probe_realtime_streams"],
        "ov",
        r["overload_admitted"],
        r["overload_admitted_with_gap"],
        r["overload_busy_queue_waited_max_ms"],
        r["overload_rss_mib"],
        " ".join(step(s) for s in r["capacity_steps"]),
    )
