"""A small real engine that fails on purpose: the synthetic engine, refusing
text with "refuse" in it (``SynthesisError(refused=True)``, as an upstream's
4xx), giving stereo chunks for text with "stereo" in it (which the
gateway's resampler rejects: an exception that is not a ``SynthesisError``)
and failing in its model for text with "crash" in it (an exception whose
text names a path and an address, which must never reach a client)."""

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


#: what the crashing model's exception says: internal detail
CRASH_TEXT = "cannot map /srv/models/voice.onnx from 10.1.2.3:9000"


class CrashWork(ToneWork):
    def decode(self, index: int) -> np.ndarray:
        raise RuntimeError(CRASH_TEXT)


class FaultyStream(ToneStream):
    def start(self, job: DeliveredJob) -> None:
        if "refuse" in job.text:
            raise SynthesisError("the reference audio cannot be read", refused=True)
        if "stereo" in job.text:
            pump(job, StereoWork(job.text, self.request.speed))
            return
        if "crash" in job.text:
            pump(job, CrashWork(job.text, self.request.speed))
            return
        super().start(job)


class FaultyEngine(SyntheticEngine):
    """The synthetic engine, refusing text with "refuse" in it and giving
    stereo chunks for text with "stereo" in it."""

    def open_stream(self, request: StreamRequest) -> EngineStream:
        return FaultyStream(request, self)
