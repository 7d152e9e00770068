#!/bin/bash
cd /tmp/wt-dbg
for i in 1 2 3 4; do
  /work/main/.venv/bin/python -m gateway bench --scenarios capacity --levels 8 --capacity-pacing llm --out /tmp/r20/dbg-$i.jsonl --report /tmp/r20/dbg-$i.html > /tmp/r20/dbg-$i.out 2>&1
  cp /tmp/gateway-bench-logs/gateway.log /tmp/r20/dbg-$i.log
  echo "$i $(grep -o 'steps: x8.*' /tmp/r20/dbg-$i.out | head -1) busy=$(grep -c 'busy' /tmp/r20/dbg-$i.log) cuts=$(grep -c 'door .* -> ' /tmp/r20/dbg-$i.log)"
done
