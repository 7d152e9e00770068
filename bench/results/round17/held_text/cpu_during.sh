#!/bin/bash
# usage: cpu_during.sh PORT [sessions]: server CPU (main thread, all) and harness CPU over one overload_timeline run
port=$1; n=${2:-40}
pid=$(pgrep -f "gateway serve --port $port" | head -1)
tick=$(getconf CLK_TCK)
main0=$(awk '{print $14+$15}' /proc/$pid/task/$pid/stat); all0=$(awk '{print $14+$15}' /proc/$pid/stat)
t0=$(date +%s.%N)
/usr/bin/time -f "harness cpu %U+%S s wall %e s" /work/main/.venv/bin/python bench/overload_timeline.py --url ws://127.0.0.1:$port/v1/audio/speech/stream --runs 1 --sessions $n --arrival-s ${3:-3.0} 2>&1 | grep -E "^refused|harness cpu"
t1=$(date +%s.%N)
main1=$(awk '{print $14+$15}' /proc/$pid/task/$pid/stat); all1=$(awk '{print $14+$15}' /proc/$pid/stat)
echo "server loop $(echo "($main1-$main0)/$tick" | bc -l | cut -c1-5) s, server all $(echo "($all1-$all0)/$tick" | bc -l | cut -c1-5) s, wall $(echo "$t1-$t0" | bc | cut -c1-5) s"
