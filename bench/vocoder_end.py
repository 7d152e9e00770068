"""The end of an utterance in the carried-state vocoder: ``finish`` against a
push then a flush (CPU, one thread, no server).

What it measures: for utterances of ``--frames`` latent frames of the bundled
voice (the benchmark paragraph through the real phonemizer, encoder and flow),
decoded chunk by chunk on the default schedule as ``ChunkDecoder`` does, the
CPU time (``time.thread_time``) of every chunk after the first, two ways on
fresh streams, interleaved in each repetition (which goes first alternates):

- ``finish``: the last piece of the push that reaches the end goes through
  ``DecoderStream.finish`` (what ``ChunkDecoder`` does);
- ``flush``: every piece pushed, then ``DecoderStream.flush`` (``finish`` of
  no frames: the end's padding in a pass of its own, as a flush).

It prints one JSON line per length: each way's CPU seconds per second of the
audio after the first chunk (p50 over the repetitions), their ratio, and the
largest difference between the two ways' samples.  Every shape is compiled
before timing (each length is decoded once both ways first).

    PYTHONPATH=. .venv/bin/python bench/vocoder_end.py --frames 40,80,120,160,240,480

To compare commits, run it with ``PYTHONPATH`` at a worktree of each in
turn (both ways only use what every carried-state commit has: before
``finish``, ``ChunkDecoder`` itself pushed then flushed, with a flush that
ran each layer two to four times).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vocoder_batch import TEXT, commit, latent_of

from gateway.engines.piper import PiperEngine
from gateway.engines.piper.settings import PiperSettings
from gateway.settings import Settings
from gateway.vocoders.stateful import StreamingHifiGan, final_pieces

SCHEDULE = [16, 32, 64]


def decode(vocoder: StreamingHifiGan, latent: np.ndarray, way: str) -> tuple[float, np.ndarray]:
    """CPU seconds of the chunks after the first, and the whole output."""
    frames = latent.shape[1]
    decoder = vocoder.open(frames)
    plan = vocoder.plan(frames, SCHEDULE)
    out = [decoder.decode_chunk(latent, plan[0])]
    stream = decoder.stream
    cpu = time.thread_time()
    with torch.inference_mode():
        for window in plan[1:]:
            if way == "finish":
                out.append(decoder.decode_chunk(latent, window))
                continue
            # the same pieces, every one pushed, then the end alone
            pieces = [decoder._held]
            count = window.win_end - stream.pushed
            if count > 0:
                sizes = final_pieces(count) if window.win_end >= frames else [count]
                for size in sizes:
                    rows = latent[:, stream.pushed : stream.pushed + size].T
                    pieces.append(stream.push(torch.from_numpy(np.ascontiguousarray(rows))))
            if stream.pushed >= frames and not stream.flushed:
                pieces.append(stream.flush())
            audio = torch.cat(pieces)
            wanted = (window.end - window.start) * vocoder.hop_length
            decoder._held = audio[wanted:].clone()
            out.append(audio[:wanted].numpy())
    return time.thread_time() - cpu, np.concatenate(out)


def measure(vocoder: StreamingHifiGan, latent: np.ndarray, reps: int) -> dict[str, Any]:
    frames = latent.shape[1]
    plan = vocoder.plan(frames, SCHEDULE)
    audio_s = (frames - plan[0].end) * vocoder.hop_length / 22050
    times: dict[str, list[float]] = {"finish": [], "flush": []}
    diff = 0.0
    for rep in range(reps + 1):
        order = ("finish", "flush") if rep % 2 == 0 else ("flush", "finish")
        outs = {}
        for way in order:
            cpu, outs[way] = decode(vocoder, latent, way)
            if rep > 0:  # the first repetition compiles the shapes
                times[way].append(cpu)
        diff = max(diff, float(np.abs(outs["finish"] - outs["flush"]).max()))
    finish = statistics.median(times["finish"]) / audio_s
    flush = statistics.median(times["flush"]) / audio_s
    return {
        "kind": "vocoder_end",
        "frames": frames,
        "audio_after_first_chunk_s": round(audio_s, 3),
        "chunks": len(plan),
        "reps": reps,
        "finish_cpu_per_audio_s": round(finish, 4),
        "flush_cpu_per_audio_s": round(flush, 4),
        "finish_over_flush": round(finish / flush, 3),
        "max_abs_diff": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", default="40,80,120,160,240,480")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(json.dumps({"kind": "machine", "commit": commit(), "torch": torch.__version__}))
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(data_dir=data_dir, piper=PiperSettings(device="cpu"))
        engine = PiperEngine(settings)
        asyncio.run(engine.start())
        voice = engine.loaded_voice("joe")
        assert voice.vocoder is not None
        latent = latent_of(voice, TEXT)
        for frames in [int(f) for f in args.frames.split(",")]:
            piece = np.ascontiguousarray(latent[:, :frames])
            print(json.dumps(measure(voice.vocoder, piece, args.reps)), flush=True)


if __name__ == "__main__":
    main()
