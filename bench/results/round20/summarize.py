import json,sys
for line in open(sys.argv[1]):
    r=json.loads(line)
    if r.get('kind')!='sweep_run': continue
    steps=' '.join(f"x{s['level']}:{'ok' if s['held'] else 'FAIL'}({s['ttfa_p95_ms']:.0f},u{s['underruns']},e{s['errors']})" for s in r['capacity_steps'])
    print(r['label'],r['run'],'held',r['capacity_held'],'h600',r.get('held_600ms'),'probe',r['probe_realtime_streams'],'ov',r['overload_admitted'],r['overload_admitted_with_gap'],r['overload_busy_queue_waited_max_ms'],r['overload_rss_mib'],steps)
