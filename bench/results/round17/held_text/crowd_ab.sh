#!/bin/bash
# the overload crowd at a fixed door of 14: new (/work/main, 59d94ad: held text)
# and old (a worktree of 0829369) servers, alternating, 6 runs each
cd /work/main
GATEWAY_MAX_ACTIVE_STREAMS=14 .venv/bin/python -m gateway serve --port 8101 > /tmp/r17/new.srv.log 2>&1 &
( cd /tmp/old17 && GATEWAY_MAX_ACTIVE_STREAMS=14 PYTHONPATH=/tmp/old17 /work/main/.venv/bin/python -m gateway serve --port 8102 > /tmp/r17/old.srv.log 2>&1 ) &
sleep 40
for i in 0 1 2 3 4 5; do
  if [ $((i % 2)) -eq 0 ]; then order="new old"; else order="old new"; fi
  for v in $order; do
    if [ $v = new ]; then port=8101; else port=8102; fi
    echo "== $v $i"
    .venv/bin/python bench/overload_timeline.py --url ws://127.0.0.1:$port/v1/audio/speech/stream --runs 1 | grep -E "^refused"
    sleep 5
  done
done
pkill -f "gateway serve --port 810"
