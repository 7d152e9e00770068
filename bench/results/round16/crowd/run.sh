#!/bin/bash
# 14 admitted (fixed door 14) with and without the refused crowd, alternating
cd /work/main
for i in 0 1 2; do
  for v in crowd alone alone crowd; do :; done
  if [ $((i % 2)) -eq 0 ]; then order="crowd alone"; else order="alone crowd"; fi
  for v in $order; do
    if [ $v = crowd ]; then n=40; else n=14; fi
    GATEWAY_MAX_ACTIVE_STREAMS=14 .venv/bin/python -m gateway bench --scenarios llm,overload --utterances 6 --overload-sessions $n --out /tmp/r16/crowd/$v-$i.jsonl > /tmp/r16/crowd/$v-$i.log 2>&1
    echo "$v $i done $(date +%T)"
  done
done
