import sys

if sys.argv[1:2] == ["serve"]:
    from gateway.heap import tune_malloc

    # before anything starts a thread (importing numpy does): gateway/heap.py
    tune_malloc()

from gateway.cli import main

sys.exit(main())
