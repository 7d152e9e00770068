"""One CUDA graph per steady batch: a tick of N streams as a single replay.

What this module is for: the eager batched tick (``SnacBatch.step``) launches
a few hundred small kernels from Python, which bounds a tick at about 11 ms
on an H200 whatever the batch size.  Once every stream of a batch is past its
look-ahead warm-up (3 frames: no start masking) and none is ending, a tick is
always the same work on the same shapes, so it is captured once as a CUDA
graph and replayed: codes, positions and the carried state live in static
tensors that the graph reads and updates in place.

Built on ``snac_stream``'s layers unchanged (their state updates are in
place for exactly this reason).  A graph belongs to one batch membership:
any join, leave or finish makes it stale (``valid`` says so), and the caller
captures a new one or falls back to ``SnacBatch.step``.

What it must not do: run a row that still needs masking (a stream's first 3
frames or its flush), or outlive its batch's membership.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gateway.vocoders.snac_stream import LATENT_PER_FRAME, Frame, SnacBatch, _Call

#: frames a stream must have pushed before it can be in a graph
WARM_FRAMES = 3


class GraphedTick:
    """A captured one-frame tick of every stream of ``batch``, in
    ``batch.keys`` order."""

    def __init__(self, batch: SnacBatch, warmup: int = 2) -> None:
        decoder = batch.decoder
        if decoder.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        rows = [batch.rows[k] for k in batch.keys]
        hop, lag = decoder.hop_length, decoder.lookahead_samples
        for row in rows:
            if row.end is not None or row.pushed * hop < lag:
                raise ValueError(f"every stream must have pushed {WARM_FRAMES} frames first")
        self.batch = batch
        self.keys = list(batch.keys)
        self.state_ids = [id(s) for s in batch.state]
        n = len(rows)
        device = decoder.device
        self.codes = torch.zeros((n, 1, 7), dtype=torch.int64, device=device)
        self.start = torch.tensor([r.pushed for r in rows], dtype=torch.int64, device=device)
        seeds = torch.tensor([r.seed for r in rows], dtype=torch.int64, device=device)
        # mask decisions are made in Python at capture: none is needed here
        call = _Call([r.pushed for r in rows], [None] * n, LATENT_PER_FRAME, device)
        call.start_t, call.seeds_t = self.start, seeds
        saved = [s.clone() for s in batch.state]
        saved_start = self.start.clone()

        def tick() -> torch.Tensor:
            out = decoder.run(decoder.latent(self.codes), batch.state, call)
            self.start.add_(LATENT_PER_FRAME)
            return out

        side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.inference_mode(), torch.cuda.stream(side):
            for _ in range(warmup):  # allocations and library handles, outside the graph
                tick()
        torch.cuda.current_stream(device).wait_stream(side)
        with torch.inference_mode():
            for s, keep in zip(batch.state, saved, strict=True):
                s.copy_(keep)
            self.start.copy_(saved_start)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = tick()

    @property
    def valid(self) -> bool:
        """Still the batch's membership and state tensors."""
        batch = self.batch
        return batch.keys == self.keys and [id(s) for s in batch.state] == self.state_ids

    def step(self, frames: Sequence[Frame]) -> dict[Any, np.ndarray]:
        """One new frame per stream (``batch.keys`` order) -> its 2048 samples."""
        if not self.valid:
            raise RuntimeError("the batch changed since this graph was captured")
        if len(frames) != len(self.keys):
            raise ValueError("one frame per stream")
        codes = torch.tensor([list(f) for f in frames], dtype=torch.int64).view(-1, 1, 7)
        self.codes.copy_(codes, non_blocking=True)
        self.graph.replay()
        audio = self.out.float().cpu().numpy()
        for key in self.keys:
            self.batch.rows[key].pushed += LATENT_PER_FRAME
        return {key: audio[i] for i, key in enumerate(self.keys)}
