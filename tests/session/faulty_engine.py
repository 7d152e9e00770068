"""A small real engine that fails on purpose: the synthetic engine, refusing
text with "refuse" in it (``SynthesisError(refused=True)``, as an upstream's
4xx) and giving stereo chunks for text with "stereo" in it (which the
gateway's resampler rejects: an exception that is not a ``SynthesisError``)."""

from __future__ import annotations

import numpy as np

from gateway.engines.base import EngineStream, StreamRequest, SynthesisError
from gateway.engines.delivery import DeliveredJob, pump
from gateway.engines.synthetic import SyntheticEngine, ToneStream, ToneWork


class StereoWork(ToneWork):
    """Chunks of the wrong shape: the gateway's resampler raises on them
    (an exception that is not a ``SynthesisError``)."""

    def decode(self, index: int) -> np.ndarray:
        mono = super().decode(index)
        return np.stack([mono, mono], axis=1)


class FaultyStream(ToneStream):
    def start(self, job: DeliveredJob) -> None:
        if "refuse" in job.text:
            raise SynthesisError("the reference audio cannot be read", refused=True)
        if "stereo" in job.text:
            pump(job, StereoWork(job.text, self.request.speed))
            return
        super().start(job)


class FaultyEngine(SyntheticEngine):
    """The synthetic engine, refusing text with "refuse" in it and giving
    stereo chunks for text with "stereo" in it."""

    def open_stream(self, request: StreamRequest) -> EngineStream:
        return FaultyStream(request, self)
