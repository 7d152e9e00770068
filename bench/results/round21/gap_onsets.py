"""The overload's admitted sessions in each run of a sweep, in arrival
order: first audio (from the first token, and the server's), underruns,
where in its playback the first began, and the longest gap.

    python bench/results/round21/gap_onsets.py bench/results/round21/sweep/runs/*.jsonl
"""

import json
import sys
from pathlib import Path

for path in map(Path, sys.argv[1:]):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    admitted = sorted(
        (r for r in rows if r.get("kind") == "overload_session" and not r.get("busy")),
        key=lambda r: r["user"],
    )
    gapped = sum(1 for r in admitted if r["underruns"])
    print(f"== {path.stem}: {len(admitted)} admitted, {gapped} with an underrun")
    for r in admitted:
        onset = r["first_underrun_at_ms"]
        print(
            f"  user {r['user']:>2}  first audio {r['ttfa_first_token_ms']:>7.0f} ms"
            f" (server {r['server_first_audio_ms']:>6.0f})  underruns {r['underruns']}"
            f"  first at {'-' if onset is None else f'{onset:.0f} ms'}"
            f"  longest gap {r['max_gap_ms']:.0f} ms"
        )
