"""The ``chime`` engine: each segment is a decaying two-partial chime, its
length from the text, rendered chunk by chunk in worker threads.

It is written against the gateway's public engine interface only
(``gateway.engines.base``, ``gateway.engines.delivery``): ``pump`` runs its
blocking steps, so the session's budget, the look-ahead bound and cancel
apply to it as to every engine.  No alignment is declared, and none is sent.
"""

from __future__ import annotations

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
    WordTimings,
)
from gateway.engines.delivery import ChunkedWork, DeliveredJob, DeliveryStream, LiveJobs, pump

if TYPE_CHECKING:
    from gateway.settings import Settings

SAMPLE_RATE = 16000
SECONDS_PER_CHAR = 0.05
CHUNK_SAMPLES = 1600  #: 100 ms


class Chime(ChunkedWork):
    """One segment's chime."""

    def __init__(self, text: str, speed: float) -> None:
        self.text = text
        self.total = max(CHUNK_SAMPLES, int(len(text) * SECONDS_PER_CHAR / speed * SAMPLE_RATE))

    def prepare(self) -> tuple[WordTimings | None, Sequence[float]]:
        sizes = [
            min(CHUNK_SAMPLES, self.total - start) for start in range(0, self.total, CHUNK_SAMPLES)
        ]
        return None, [n / SAMPLE_RATE for n in sizes]

    def render(self, start: int, stop: int) -> np.ndarray:
        t = np.arange(start, stop) / SAMPLE_RATE
        decay = np.exp(-3.0 * t / (self.total / SAMPLE_RATE))
        tone = np.sin(2 * np.pi * 660.0 * t) + 0.5 * np.sin(2 * np.pi * 1320.0 * t)
        return (0.3 * decay * tone).astype(np.float32)

    def decode(self, index: int) -> np.ndarray:
        start = index * CHUNK_SAMPLES
        return self.render(start, min(self.total, start + CHUNK_SAMPLES))


class ChimeStream(DeliveryStream):
    def __init__(self, request: StreamRequest, engine: ChimeEngine) -> None:
        super().__init__(request, engine.live)
        self.engine = engine

    def start(self, job: DeliveredJob) -> None:
        if self.engine.find_voice(self.request.voice) is None:
            raise SynthesisError(f"chime has no voice {self.request.voice!r}")
        pump(job, Chime(job.text, self.request.speed))


class ChimeEngine(Engine):
    name = "chime"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.live = LiveJobs()

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        self.live.cancel_all()

    def voices(self) -> Sequence[VoiceInfo]:
        return (
            VoiceInfo(
                name="bell",
                language="en-US",
                language_name="English",
                sample_rate=SAMPLE_RATE,
                quality="example",
                engine=self.name,
                description="A chime per segment (an example engine).",
            ),
        )

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            sample_rates=(SAMPLE_RATE,),
            alignment=False,
            languages=("en-US",),
            typical_first_chunk_s=0.01,
        )

    def open_stream(self, request: StreamRequest) -> EngineStream:
        return ChimeStream(request, self)

    def live_jobs(self) -> int:
        return len(self.live)
