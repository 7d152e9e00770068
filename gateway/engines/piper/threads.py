"""How many threads each model pool uses, decided per work item.

What this module is for: on a small CPU the acoustic pool (onnxruntime) and
the vocoder pool (torch) share the cores.  Alone, a stage is fastest with
every core: on the first-audio path the stages run one after another, and
2+2 threads took the first chunk from 131 ms to 94 ms (p50) against 1+1 on
2 cores.  Under load both workers are busy at once, and 2+2 threads on 2
cores oversubscribe them: with 4 sessions starting together, 1+1 threads
cut the playback gaps over 100 ms from 6 to 2 (one probe run each, 4 clients
of `gateway.client` sending a flushed paragraph each, against one server).
So, with the ``auto`` setting (0), a pool uses every core (up to 4) while the
other worker is idle and one thread while it is working; a thread count set
in the settings is used as it is.  Two exceptions keep the first-audio path
fast: an utterance's first chunk always gets every core (the acoustic item
that fed it may still be finishing), and the acoustic model goes light only
when decode work is *queued*, not for the chunk in flight (a segment's last
chunk releases its consumer, which may submit the next text, before the
decode worker is marked idle).

The decode worker has one thread per core (up to 4: ``decode_worker_threads``),
so the vocoder work of many sessions spreads over every core (one decode
thread serialized every session's vocoder work on one core while the others
idled: issue 27's profile).  Each decode thread sets its own intra-op thread
count (torch's count is per calling thread under OpenMP): every core while
it is the only thread working, one while another decode thread or the
acoustic worker works.

What it must not do: call torch from any thread but the decode worker's (the
thread count is set there, before each chunk).
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch

from gateway.engines.deadline_worker import DeadlineWorker


def default_threads() -> int:
    """Every core, up to 4."""
    return max(1, min(4, os.cpu_count() or 2))


def decode_worker_threads(vocoder_threads: int, deterministic: bool, device: str) -> int:
    """Decode threads: one per core (up to 4) with the ``auto`` thread
    setting on the CPU; one when a count is set, the output must be
    deterministic, or the vocoder runs on an accelerator."""
    if deterministic or vocoder_threads or device != "cpu":
        return 1
    return default_threads()


class ThreadPlan:
    def __init__(
        self,
        acoustic_threads: int,
        vocoder_threads: int,
        acoustic_worker: DeadlineWorker,
        decode_worker: DeadlineWorker,
        adaptive: bool = True,
    ) -> None:
        # counts that follow the load can change the last bit of the audio
        # (kernels differ with the thread count): ``adaptive=False`` for the
        # deterministic setting
        self.adaptive_acoustic = adaptive and acoustic_threads == 0
        self.adaptive_vocoder = adaptive and vocoder_threads == 0
        self.acoustic_threads = acoustic_threads or default_threads()
        self.vocoder_threads = vocoder_threads or default_threads()
        self._acoustic_worker = acoustic_worker
        self._decode_worker = decode_worker
        #: the intra-op count each decode thread last set
        self._local = threading.local()

    def acoustic_light(self, fixed: bool = False) -> bool:
        """Run the next acoustic item on one thread (decode work is waiting).
        ``fixed``: the item's output must repeat (a seeded request): never."""
        light = not fixed and self.adaptive_acoustic and self._decode_worker.depth() > 0
        self._local.acoustic = 1 if light else self.acoustic_threads
        return light

    def acoustic_used(self) -> int:
        """On the acoustic worker, after an item: the threads its model last ran with."""
        return int(getattr(self._local, "acoustic", self.acoustic_threads))

    def vocoder_used(self) -> int:
        """On a decode thread, after an item: the intra-op threads
        ``set_vocoder_threads`` last set there."""
        return int(getattr(self._local, "threads", self.vocoder_threads))

    def set_vocoder_threads(self, first_chunk: bool, fixed: bool = False) -> None:
        """On the decode worker, before a chunk: every core for an
        utterance's first chunk or while the acoustic worker is idle.
        ``fixed``: the chunk's output must repeat (a seeded request): the
        configured count, whatever the load."""
        beside = self._decode_worker.running > 1  # another decode thread works too
        light = (
            self.adaptive_vocoder
            and not fixed
            and (beside or (not first_chunk and self._acoustic_worker.active()))
        )
        want = 1 if light else self.vocoder_threads
        if want != getattr(self._local, "threads", 0):
            torch.set_num_threads(want)
            self._local.threads = want


def configure_torch_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    # can only be set before the first parallel work; later calls raise
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
