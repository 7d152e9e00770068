"""Streaming sample-rate conversion from the voice's native rate to the client's.

``StreamResampler`` wraps ``soxr.ResampleStream`` (libsoxr, float32, mono).
Its filter state carries across ``process`` calls, so a sentence fed in
arbitrary chunks, or several sentences fed back to back, come out exactly as
if the whole signal had been resampled at once.  ``flush`` emits the tail the
filter still holds and resets the state, ready for an unrelated signal: the
session flushes at the end of a sentence unless the next sentence is already
queued, in which case it keeps feeding and the join stays seamless.

Quality ``HQ`` (libsoxr's 20-bit setting) was chosen by measurement (see
``docs/audio.md``): ``LQ`` and ``MQ`` hold back the same amount of audio for
downsampling but lose passband and SNR, and ``VHQ`` doubles the hold-back when
downsampling for a gain far below what 16-bit or G.711 output can carry.

``delay_ms`` is the latency the resampler adds: audio it has accepted but not
yet emitted.  It is exact (computed from sample counts, not estimated) and is
zero for the pass-through used when the rates are equal.

Not thread-safe; one instance per output stream.  No I/O, no asyncio.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import soxr

#: libsoxr quality preset used for every conversion
QUALITY: Final = "HQ"


class StreamResampler:
    """Resample a mono float32 stream chunk by chunk, keeping filter state."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} and {out_rate}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream: soxr.ResampleStream | None = None
        if in_rate != out_rate:
            self._stream = soxr.ResampleStream(
                in_rate, out_rate, 1, dtype="float32", quality=QUALITY
            )
        # counted since the last flush, to report the hold-back exactly
        self._samples_in = 0
        self._samples_out = 0

    @property
    def passthrough(self) -> bool:
        """True when the rates are equal and samples are copied unchanged."""
        return self._stream is None

    @property
    def delay_ms(self) -> float:
        """Milliseconds of accepted input not yet emitted (0 for a pass-through)."""
        pending = self._samples_in * self.out_rate / self.in_rate - self._samples_out
        return max(0.0, pending) * 1000.0 / self.out_rate

    def process(self, chunk: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Resample one chunk; returns whatever output is ready (possibly empty)."""
        x = np.ascontiguousarray(chunk, dtype=np.float32)
        if x.ndim != 1:
            raise ValueError(f"expected mono samples (1-D), got shape {x.shape}")
        if self._stream is None:
            return x.copy()
        out = np.asarray(self._stream.resample_chunk(x), dtype=np.float32)
        self._samples_in += len(x)
        self._samples_out += len(out)
        return out

    def flush(self) -> npt.NDArray[np.float32]:
        """Emit the tail held in the filter and reset for an unrelated signal."""
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        tail = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        out = np.asarray(tail, dtype=np.float32)
        self._stream.clear()
        self._samples_in = 0
        self._samples_out = 0
        return out
