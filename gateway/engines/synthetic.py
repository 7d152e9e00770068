"""A synthetic engine: tones with realistic timing, for load tests and fault
injection.  It is never the default and never the engine a speech-behaviour
test relies on alone.

Each segment lasts ``ms_per_char`` per character (divided by ``speed``); its
"acoustic" stage and each "decode" chunk take wall time in a worker thread
(``time.sleep``, so it loads the scheduler without burning the cores).  Word
timings are spread evenly over the audio: they are honest about being
synthetic and only exist so clients can exercise the ``alignment`` path.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence

import numpy as np

from gateway.engines.base import (
    AudioChunk,
    Engine,
    EngineEvent,
    JobStats,
    SynthesisJob,
    SynthesisRequest,
    VoiceInfo,
    WordTiming,
    WordTimings,
)

SAMPLE_RATE = 22050
MS_PER_CHAR = 60.0
ACOUSTIC_S = 0.02
CHUNK_S = 0.004
CHUNK_SAMPLES = 4096


class SyntheticJob(SynthesisJob):
    def __init__(self, request: SynthesisRequest, engine: SyntheticEngine) -> None:
        self.request = request
        self.stats = JobStats()
        self._cancelled = threading.Event()
        self._engine = engine
        self._submitted = time.monotonic()
        self._counted = True
        engine._live += 1

    def _release(self) -> None:
        """Leave the live-jobs gauge once: at the end, or at a cancel (a job
        cancelled before anyone iterated it never runs its ``finally``)."""
        if self._counted:
            self._counted = False
            self._engine._live -= 1

    def cancel(self) -> None:
        if not self._cancelled.is_set():
            self._cancelled.set()
            self.stats.cancelled = True
        self._release()

    def _decode_chunk(self, start: int, stop: int, total: int, pitch: float) -> np.ndarray:
        if self._cancelled.is_set():
            return np.zeros(0, np.float32)
        time.sleep(CHUNK_S)
        t = np.arange(start, stop) / SAMPLE_RATE
        envelope = np.minimum(
            1.0, np.minimum(np.arange(start, stop), total - np.arange(start, stop)) / 200
        )
        return (0.3 * envelope * np.sin(2 * np.pi * pitch * t)).astype(np.float32)

    async def _events(self) -> AsyncIterator[EngineEvent]:
        try:
            req = self.request
            if self._cancelled.is_set():
                return
            await asyncio.to_thread(time.sleep, ACOUSTIC_S)
            self.stats.acoustic_ms = ACOUSTIC_S * 1000
            total = max(1, int(len(req.text) * MS_PER_CHAR / req.speed * SAMPLE_RATE / 1000))
            if req.alignment:
                words = req.text.split()
                span = total / SAMPLE_RATE * 1000 / max(1, len(words))
                yield WordTimings(
                    tuple(WordTiming(w, i * span, (i + 1) * span) for i, w in enumerate(words))
                )
            pitch = 220.0 + 20.0 * (len(req.text) % 7)
            for start in range(0, total, CHUNK_SAMPLES):
                if self._cancelled.is_set():
                    return
                stop = min(total, start + CHUNK_SAMPLES)
                samples = await asyncio.to_thread(self._decode_chunk, start, stop, total, pitch)
                if not samples.size:
                    return
                self.stats.chunks_decoded += 1
                self.stats.audio_samples += samples.size
                if self.stats.chunks_decoded == 1:
                    self.stats.first_chunk_ms = (time.monotonic() - self._submitted) * 1000
                yield AudioChunk(samples)
        finally:
            self._release()

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._events()


class SyntheticEngine(Engine):
    name = "synthetic"

    _live = 0

    async def start(self) -> None:
        return None

    def voices(self) -> Sequence[VoiceInfo]:
        return (
            VoiceInfo(
                name="tone",
                language="en-US",
                language_name="English",
                sample_rate=SAMPLE_RATE,
                quality="synthetic",
                engine=self.name,
                description="Sine tones with realistic timing, for load tests.",
                language_aliases=("en_US", "en"),
            ),
        )

    def submit(self, request: SynthesisRequest) -> SynthesisJob:
        return SyntheticJob(request, self)

    def live_jobs(self) -> int:
        return self._live
