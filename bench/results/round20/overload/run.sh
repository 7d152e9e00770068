#!/bin/bash
# overload A/B, alternating: base (016160a) vs keeps (3755589, the cut rule on 016160a)
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then order="base keeps"; else order="keeps base"; fi
  for v in $order; do
    cd /tmp/wt-$v
    /work/main/.venv/bin/python -m gateway bench --scenarios overload --overload-settle-s 5 --out /tmp/r20/ov/$v-$i.jsonl --report /tmp/r20/ov/$v-$i.html > /tmp/r20/ov/$v-$i.out 2>&1
    cp /tmp/gateway-bench-logs/gateway.log /tmp/r20/ov/$v-$i.log
    echo "$v $i $(grep -o 'overload 40 sessions: [^,]*' /tmp/r20/ov/$v-$i.out | head -1)"
  done
done
