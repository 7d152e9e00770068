import sys

if sys.argv[1:2] == ["serve"]:
    from gateway.ops.heap import tune_malloc

    # before anything starts a thread (importing numpy does): gateway/ops/heap.py
    tune_malloc()

from gateway.cli import main

sys.exit(main())
