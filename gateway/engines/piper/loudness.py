"""The fixed output gain and the soft limiter.

Piper peak-normalizes each sentence, which a streaming decoder cannot do: it
would need the whole sentence's peak before sending the first sample.  So the
streamed audio gets one fixed gain per voice, chosen once so that its
integrated loudness (ITU-R BS.1770 through pyloudnorm) equals Piper's own
normalized output on a calibration text kept in the repo
(``gateway/data/calibration.txt``).  Piper's normalization targets the peak, so a
fixed gain sends some sentences' peaks past full scale: a memoryless soft
limiter (identity below ``KNEE``, a tanh curve above it that never reaches
``CEILING``) keeps every sample inside [-1, 1] without a look-ahead delay.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

KNEE = 0.85
CEILING = 0.99


def soft_limit(audio: np.ndarray) -> np.ndarray:
    """Identity below ``KNEE``; above, a smooth curve below ``CEILING``."""
    magnitude = np.abs(audio)
    if magnitude.size == 0 or float(magnitude.max()) <= KNEE:
        return audio.astype(np.float32, copy=False)
    span = CEILING - KNEE
    limited = KNEE + span * np.tanh((magnitude - KNEE) / span)
    out = np.where(magnitude > KNEE, np.sign(audio) * limited, audio)
    return out.astype(np.float32)


def integrated_loudness(audio: np.ndarray, sample_rate: int) -> float:
    import pyloudnorm  # optional dependency of the piper extra

    meter = pyloudnorm.Meter(sample_rate)
    return float(meter.integrated_loudness(audio.astype(np.float64)))


def peak_normalized(sentences: Sequence[np.ndarray]) -> np.ndarray:
    """What Piper outputs with ``normalize_audio``: each sentence to peak 1."""
    parts = [s / max(float(np.abs(s).max()), 1e-8) for s in sentences]
    return np.concatenate(parts).astype(np.float32)


def calibrate_gain(sentences: Sequence[np.ndarray], sample_rate: int) -> float:
    """The gain that gives the raw sentences Piper's normalized loudness."""
    reference = integrated_loudness(peak_normalized(sentences), sample_rate)
    raw = integrated_loudness(np.concatenate(sentences), sample_rate)
    return float(10.0 ** ((reference - raw) / 20.0))
