"""What one streamed decode keeps between its chunks, and what a decode costs.

What it measures (issue 28, the hostile scenario's peak RSS): the bundled
voice's ``ChunkDecoder`` decodes a latent of ``--frames`` frames chunk by
chunk (the default schedule, 16, 32, then 64 frames).  After each chunk it
sums the bytes of the buffers that the stream's carried state keeps alive
(each distinct storage once) against the bytes of the state itself: a state
tensor that is a view into a chunk's activations keeps the whole activation
buffer alive until the next chunk, and every stream the engine is decoding
holds that between its chunks.  Then ``--reps`` whole decodes are timed in
thread CPU time (one torch thread: the decode runs on the calling thread),
the first chunk and the whole latent.

Prints one JSON line per chunk (``kind: "retained"``) and one summary
(``kind: "decode_cpu"``), with the commit of the code measured.  To measure
another commit, run this file with that commit's checkout first on
``PYTHONPATH``:

    PYTHONPATH=. .venv/bin/python bench/decode_state_memory.py
    PYTHONPATH=/path/to/old/checkout .venv/bin/python bench/decode_state_memory.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

from gateway.bench.provenance import source_revision
from gateway.engines.piper import PiperEngine
from gateway.engines.piper.settings import PiperSettings
from gateway.settings import Settings
from gateway.vocoders.stateful import ChunkDecoder, StreamingHifiGan

SCHEDULE = [16, 32, 64]


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def retained(decoder: ChunkDecoder) -> tuple[int, int]:
    """(bytes of the storages the carried state keeps alive, bytes of the state)."""
    tensors = [t for t in decoder.stream.state() if isinstance(t, torch.Tensor)]
    tensors.append(decoder._held)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values()), sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300, help="latent frames decoded")
    parser.add_argument("--reps", type=int, default=20, help="timed whole decodes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as data:
        settings = Settings(data_dir=data, piper=PiperSettings(deterministic=True, device="cpu"))
        engine = PiperEngine(settings)
        asyncio.run(engine.start())
        vocoder = engine.loaded_voice("joe").vocoder
        assert isinstance(vocoder, StreamingHifiGan)
        rng = np.random.default_rng(0)
        latent = rng.standard_normal((vocoder.latent_channels, args.frames)).astype(np.float32)
        windows = vocoder.plan(args.frames, SCHEDULE)
        source = source_revision()
        decoder = vocoder.open(args.frames)
        for index, window in enumerate(windows[:5]):
            decoder.decode_chunk(latent, window)
            kept, state = retained(decoder)
            emit(
                {
                    "kind": "retained",
                    "chunk": index,
                    "chunk_frames": window.end - window.start,
                    "kept_mib": round(kept / 2**20, 2),
                    "state_mib": round(state / 2**20, 3),
                    "source": source,
                }
            )
        first: list[float] = []
        whole: list[float] = []
        for _ in range(args.reps):
            decoder = vocoder.open(args.frames)
            started = time.thread_time()
            decoder.decode_chunk(latent, windows[0])
            first.append((time.thread_time() - started) * 1e3)
            for window in windows[1:]:
                decoder.decode_chunk(latent, window)
            whole.append((time.thread_time() - started) * 1e3)
        asyncio.run(engine.aclose())
    emit(
        {
            "kind": "decode_cpu",
            "frames": args.frames,
            "reps": args.reps,
            "first_chunk_cpu_ms_p50": round(statistics.median(first), 2),
            "whole_cpu_ms_p50": round(statistics.median(whole), 1),
            "loadavg_1m": os.getloadavg()[0],
            "torch": torch.__version__,
            "source": source,
        }
    )


if __name__ == "__main__":
    main()
