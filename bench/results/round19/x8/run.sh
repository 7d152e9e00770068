#!/bin/bash
# alternate x8 ladder steps (default door): base (wt-base, 6861885) vs flow (wt-f4, f4e275d)
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then order="base f4"; else order="f4 base"; fi
  for v in $order; do
    cd /tmp/wt-$v
    /work/main/.venv/bin/python -m gateway bench --scenarios capacity --levels 8 --capacity-pacing llm --out /tmp/x8/$v-$i.jsonl --report /tmp/x8/$v-$i.html > /tmp/x8/$v-$i.out 2>&1
    cp /tmp/gateway-bench-logs/gateway.log /tmp/x8/$v-$i.log
    echo "$v $i $(grep -o 'steps: x8.*' /tmp/x8/$v-$i.out | head -1) busy=$(grep -c 'busy' /tmp/x8/$v-$i.log)"
  done
done
