"""Streaming resampler: state across chunks and segments, flush, pass-through, delay."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from gateway.audio.resample import QUALITY, StreamResampler

IN_RATE = 22050
EDGE_S = 0.1  # compare away from the start and end transients


def _sweep(
    t: np.ndarray, f0: float = 50.0, f1: float = 3400.0, duration: float = 2.0
) -> np.ndarray:
    """Exponential sine sweep f0 to f1 Hz over ``duration`` seconds, sampled at times ``t``."""
    k = np.log(f1 / f0)
    phase = 2 * np.pi * f0 * duration / k * (np.exp(t / duration * k) - 1)
    return np.asarray(0.5 * np.sin(phase))


def _snr_db(reference: np.ndarray, actual: np.ndarray) -> float:
    noise = np.sum((actual.astype(np.float64) - reference) ** 2)
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / max(noise, 1e-30)))


def _stream(
    resampler: StreamResampler, x: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    out = []
    position = 0
    while position < len(x):
        size = int(rng.integers(1, 3000))
        out.append(resampler.process(x[position : position + size]))
        position += size
    return out


@pytest.mark.parametrize("out_rate", [8000, 48000])
def test_sweep_across_two_queued_segments(out_rate: int) -> None:
    """Two segments back to back, no flush between: as good as one-shot resampling."""
    rng = np.random.default_rng(out_rate)
    t = np.arange(int(2.0 * IN_RATE)) / IN_RATE
    signal = _sweep(t).astype(np.float32)
    cut = int(rng.integers(IN_RATE // 2, 3 * IN_RATE // 2))  # where segment 1 ends
    resampler = StreamResampler(IN_RATE, out_rate)
    chunks = _stream(resampler, signal[:cut], rng) + _stream(resampler, signal[cut:], rng)
    chunks.append(resampler.flush())
    streamed = np.concatenate(chunks)

    one_shot = soxr.resample(signal, IN_RATE, out_rate, quality=QUALITY)
    assert abs(len(streamed) - len(one_shot)) <= 1
    n = min(len(streamed), len(one_shot))
    edge = int(EDGE_S * out_rate)
    inner = slice(edge, n - edge)
    assert _snr_db(one_shot[inner], streamed[inner]) >= 60

    # and against the ideal: the same sweep evaluated at the output sample times
    ideal = _sweep(np.arange(n) / out_rate)
    assert _snr_db(ideal[inner], streamed[inner]) >= 60


@pytest.mark.parametrize("out_rate", [8000, 16000, 24000, 44100, 48000])
def test_flush_emits_the_tail_and_resets(out_rate: int) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(12345).astype(np.float32) * 0.1
    resampler = StreamResampler(IN_RATE, out_rate)
    first = np.concatenate([*_stream(resampler, x, rng), resampler.flush()])
    assert abs(len(first) - len(x) * out_rate / IN_RATE) <= 1
    assert resampler.delay_ms == 0
    # the state is reset: a second signal comes out as from a fresh resampler
    second = np.concatenate([resampler.process(x[:3000]), resampler.flush()])
    fresh = StreamResampler(IN_RATE, out_rate)
    np.testing.assert_array_equal(second, np.concatenate([fresh.process(x[:3000]), fresh.flush()]))


def test_passthrough_when_rates_match() -> None:
    resampler = StreamResampler(22050, 22050)
    assert resampler.passthrough
    x = np.linspace(-1, 1, 100, dtype=np.float32)
    y = resampler.process(x)
    np.testing.assert_array_equal(y, x)
    assert y is not x
    assert resampler.delay_ms == 0
    assert len(resampler.flush()) == 0


@pytest.mark.parametrize(
    ("out_rate", "mean_max_ms", "peak_max_ms"), [(8000, 50, 85), (48000, 26, 45)]
)
def test_added_delay_is_bounded(out_rate: int, mean_max_ms: float, peak_max_ms: float) -> None:
    """The hold-back measured on the audio clock, fed 20 ms chunks (see docs/audio.md)."""
    resampler = StreamResampler(IN_RATE, out_rate)
    x = np.random.default_rng(3).standard_normal(3 * IN_RATE).astype(np.float32) * 0.1
    delays = []
    for start in range(0, len(x), 441):
        resampler.process(x[start : start + 441])
        delays.append(resampler.delay_ms)
    steady = delays[len(delays) // 4 :]
    assert 0 < np.mean(steady) <= mean_max_ms
    assert max(delays) <= peak_max_ms


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="positive"):
        StreamResampler(0, 8000)
    with pytest.raises(ValueError, match="mono"):
        StreamResampler(22050, 8000).process(np.zeros((10, 2), np.float32))
