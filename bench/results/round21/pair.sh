#!/bin/bash
# Same server, same minutes: the ladder steps of 8 (which warms the door, as in the sweep) and 14
# conversations, then the overload (40 sessions that speak all the time),
# four times; every session's figures kept (gap_onsets.py reads them).
out=${1:?usage: pair.sh OUTDIR (run from the root of the checkout)}
mkdir -p "$out"
for i in 1 2 3 4; do
  .venv/bin/python -m gateway bench --scenarios capacity,overload --levels 8,14 \
    --capacity-pacing llm --out "$out/pair-$i.jsonl" --report "$out/pair-$i.html" \
    > "$out/pair-$i.out" 2>&1
  cp /tmp/gateway-bench-logs/gateway.log "$out/pair-$i.log"
  echo "$i $(grep -o 'x14 p95[^,]*' "$out/pair-$i.out") | $(grep -o 'overload 40 sessions: [^,]*' "$out/pair-$i.out")"
done
