#!/bin/bash
# usage: run.sh SESSIONS SEEDS... ; alternates base(8721)/new(8722)
cd /work/main
S=$1; shift
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
PB=$(pgrep -f "serve --port 8721" | head -1); PN=$(pgrep -f "serve --port 8722" | head -1)
i=0
for seed in "$@"; do
  if [ $((i % 2)) = 0 ]; then order="8721 8722"; else order="8722 8721"; fi
  i=$((i+1))
  for port in $order; do
    if [ $port = 8721 ]; then pid=$PB; label=base; else pid=$PN; label=new; fi
    c0=$(cpu $pid)
    line=$(.venv/bin/python bench/boundary_leads.py --url ws://127.0.0.1:$port/v1/audio/speech/stream --sessions $S --seed $seed --label $label 2>/dev/null | tail -1)
    c1=$(cpu $pid)
    echo "$line cpu_s=$(( (c1 - c0) ))e-2"
    sleep 2
  done
done
