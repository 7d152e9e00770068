"""A synthetic engine: tones with realistic timing, for load tests and fault
injection.  It is never the default and never the engine a speech-behaviour
test relies on alone.

Each segment lasts ``ms_per_char`` per character (divided by ``speed``); its
"acoustic" stage and each "decode" chunk take wall time in a worker thread
(``time.sleep``, so it loads the scheduler without burning the cores).  Word
timings are spread evenly over the audio: they are honest about being
synthetic and only exist so clients can exercise the ``alignment`` path.

It holds no threading, budget or delivery code: ``delivery.pump`` runs its
steps, so the session's budget and the look-ahead bound apply to it as to
every engine.  It has no settings section.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from gateway.engines.base import (
    Capabilities,
    Engine,
    EngineStream,
    StreamRequest,
    SynthesisError,
    VoiceInfo,
    WordTiming,
    WordTimings,
)
from gateway.engines.contract import ContractHooks, Patch
from gateway.engines.delivery import ChunkedWork, DeliveredJob, DeliveryStream, LiveJobs, pump

if TYPE_CHECKING:
    from gateway.settings import Settings

SAMPLE_RATE = 22050
MS_PER_CHAR = 60.0
ACOUSTIC_S = 0.02
CHUNK_S = 0.004
CHUNK_SAMPLES = 4096


class ToneWork(ChunkedWork):
    """One segment's tone: its length from the text, its pitch from its length."""

    def __init__(self, text: str, speed: float) -> None:
        self.text = text
        self.total = max(1, int(len(text) * MS_PER_CHAR / speed * SAMPLE_RATE / 1000))
        self.pitch = 220.0 + 20.0 * (len(text) % 7)

    def prepare(self) -> tuple[WordTimings | None, Sequence[float]]:
        time.sleep(ACOUSTIC_S)
        words = self.text.split()
        span = self.total / SAMPLE_RATE * 1000 / max(1, len(words))
        timings = WordTimings(
            tuple(WordTiming(w, i * span, (i + 1) * span) for i, w in enumerate(words))
        )
        sizes = [
            min(CHUNK_SAMPLES, self.total - start) for start in range(0, self.total, CHUNK_SAMPLES)
        ]
        return timings, [n / SAMPLE_RATE for n in sizes]

    def decode(self, index: int) -> np.ndarray:
        time.sleep(CHUNK_S)
        start = index * CHUNK_SAMPLES
        stop = min(self.total, start + CHUNK_SAMPLES)
        n = np.arange(start, stop)
        envelope = np.minimum(1.0, np.minimum(n, self.total - n) / 200)
        t = n / SAMPLE_RATE
        return (0.3 * envelope * np.sin(2 * np.pi * self.pitch * t)).astype(np.float32)


class ToneStream(DeliveryStream):
    def __init__(self, request: StreamRequest, engine: SyntheticEngine) -> None:
        super().__init__(request, engine._live)
        self._engine = engine

    def start(self, job: DeliveredJob) -> None:
        if self._engine.find_voice(self.request.voice) is None:
            raise SynthesisError(f"unknown voice {self.request.voice!r}")
        pump(job, ToneWork(job.text, self.request.speed))


class SyntheticEngine(Engine):
    name = "synthetic"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._live = LiveJobs()

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        self._live.cancel_all()

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

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            sample_rates=(SAMPLE_RATE,),
            alignment=True,
            languages=("en-US",),
            # deterministic: every seed gives its one, reproducible output
            seed=True,
            typical_first_chunk_s=ACOUSTIC_S + CHUNK_S,
        )

    def open_stream(self, request: StreamRequest) -> EngineStream:
        return ToneStream(request, self)

    def live_jobs(self) -> int:
        return len(self._live)


def _fail_segment(patch: Patch, marker: str) -> None:
    """The tone generator fails at its second chunk: a mid-segment failure."""
    decode = ToneWork.decode

    def failing(self: ToneWork, index: int) -> np.ndarray:
        if marker in self.text and index == 1:
            raise RuntimeError("injected decode failure")
        return decode(self, index)

    patch(ToneWork, "decode", failing)


#: the engine's part of the contract suite (``gateway.engines.contract``)
CONTRACT_HOOKS = ContractHooks(fail_segment=_fail_segment)
