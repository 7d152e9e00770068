"""Cutting audio into binary WebSocket messages: the frame grid and tagged headers.

Frame grid.  Frame ``k`` of a sentence holds samples
``[start(k), start(k + 1))`` with ``start(k) = round(k * rate * frame_ms / 1000)``,
where ``round`` rounds halves up and is computed in exact integer arithmetic
(``frame_start``).  So frames at 22050 Hz and 10 ms alternate 221 and 220
samples and never drift from the audio clock.  ``Framer`` applies the grid to
a stream of chunks of any size; ``flush`` ends the sentence, returns the
short remainder and restarts the grid at frame 0 for the next sentence.

Tagged framing.  With ``framing: "tagged"`` every binary message starts with
a fixed 20-byte header; its one implementation is ``voice_gateway_wire.frames``
(integrations/wire, shared with ``gateway.client`` and the framework plugins),
re-exported here.  ``docs/audio.md`` is the reference for clients.

This module is pure: no I/O, no asyncio.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from voice_gateway_wire.frames import (
    HEADER_SIZE,
    TAGGED_VERSION,
    FrameFlags,
    TaggedHeader,
    pack_header,
    unpack_frame,
)

#: the tagged header names are re-exported: ``gateway.audio.framing`` stays
#: the gateway's one place for both halves of framing
__all__ = [
    "HEADER_SIZE",
    "TAGGED_VERSION",
    "FrameFlags",
    "Framer",
    "TaggedHeader",
    "frame_start",
    "pack_header",
    "unpack_frame",
]

# --- the frame grid -------------------------------------------------------------


def frame_start(index: int, sample_rate: int, frame_ms: int) -> int:
    """First sample of frame ``index``: ``round(index * sample_rate * frame_ms / 1000)``.

    Halves round up; integer arithmetic, so it is exact for any index.
    """
    return (2 * index * sample_rate * frame_ms + 1000) // 2000


class Framer:
    """Split one sentence's audio, arriving in chunks, into frames on the grid."""

    def __init__(self, sample_rate: int, frame_ms: int) -> None:
        if sample_rate <= 0 or frame_ms <= 0:
            raise ValueError(f"invalid frame grid: {sample_rate} Hz, {frame_ms} ms")
        if sample_rate * frame_ms < 1000:  # some frames would be empty
            raise ValueError(f"a {frame_ms} ms frame at {sample_rate} Hz holds no sample")
        self.sample_rate = sample_rate
        self.frame_ms = frame_ms
        self._frame_index = 0  # index of the next frame to emit
        self._pending: list[npt.NDArray[np.float32]] = []
        self._pending_len = 0

    @property
    def frame_index(self) -> int:
        """Index (within the sentence) of the next frame ``push`` will complete."""
        return self._frame_index

    @property
    def pending_samples(self) -> int:
        """Samples buffered towards the next frame."""
        return self._pending_len

    def _frame_len(self, index: int) -> int:
        return frame_start(index + 1, self.sample_rate, self.frame_ms) - frame_start(
            index, self.sample_rate, self.frame_ms
        )

    def push(self, samples: npt.ArrayLike) -> list[npt.NDArray[np.float32]]:
        """Add samples; return every frame they complete, in order (maybe none)."""
        x = np.array(samples, dtype=np.float32)  # a copy: the caller may reuse its buffer
        if x.ndim != 1:
            raise ValueError(f"expected mono samples (1-D), got shape {x.shape}")
        if len(x) == 0:
            return []
        self._pending.append(x)
        self._pending_len += len(x)
        if self._pending_len < self._frame_len(self._frame_index):
            return []
        buffer = np.concatenate(self._pending)
        frames: list[npt.NDArray[np.float32]] = []
        position = 0
        while True:
            length = self._frame_len(self._frame_index)
            if len(buffer) - position < length:
                break
            frames.append(buffer[position : position + length])
            position += length
            self._frame_index += 1
        rest = buffer[position:]
        self._pending = [rest] if len(rest) else []
        self._pending_len = len(rest)
        return frames

    def flush(self) -> npt.NDArray[np.float32] | None:
        """End the sentence: return the short last frame (None if empty), restart at 0."""
        rest = np.concatenate(self._pending) if self._pending else None
        self._pending = []
        self._pending_len = 0
        self._frame_index = 0
        return rest
