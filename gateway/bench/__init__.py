"""The latency benchmark harness behind ``python -m gateway bench``.

* ``measure``: pure: the listener's playout clock, underruns and input
  starvation, percentiles;
* ``drivers``: one utterance against the gateway, a vllm-omni-protocol server
  or Piper's HTTP server, with arrival times;
* ``runner``: scenarios, capacity steps, processes under test, JSON lines;
* ``report``: the terminal table, the HTML report and the README section;
* ``corpus``: the shipped text.

Definitions of every measure: ``docs/benchmarks.md``.
"""
