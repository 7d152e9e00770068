"""Sample encodings: round trips, exact G.711 code points, agreement with libsndfile."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gateway.audio.encoding import ENCODINGS, Encoding, bytes_per_sample, decode, encode

G711: dict[Encoding, str] = {"mulaw": "ULAW", "alaw": "ALAW"}


def _signal(n: int = 48_000, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ramp = np.linspace(-1.0, 1.0, n)
    quiet = rng.standard_normal(n) * 0.01
    loud = rng.uniform(-1.0, 1.0, n)
    return np.concatenate([ramp, quiet, loud]).astype(np.float32)


def _libsndfile_encode(x: np.ndarray, subtype: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, 8000, format="RAW", subtype=subtype)
    return buf.getvalue()


def _libsndfile_decode(data: bytes, subtype: str) -> np.ndarray:
    samples, _ = sf.read(
        io.BytesIO(data),
        samplerate=8000,
        channels=1,
        format="RAW",
        subtype=subtype,
        dtype="int16",
    )
    return np.asarray(samples)


@pytest.mark.parametrize(
    ("encoding", "width"), [("pcm_s16le", 2), ("pcm_f32le", 4), ("mulaw", 1), ("alaw", 1)]
)
def test_bytes_per_sample(encoding: Encoding, width: int) -> None:
    assert bytes_per_sample(encoding) == width
    assert len(encode(np.zeros(7, np.float32), encoding)) == 7 * width


def test_unknown_encoding_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown encoding"):
        bytes_per_sample("opus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown encoding"):
        encode(np.zeros(3, np.float32), "opus")  # type: ignore[arg-type]


def test_s16_is_rounded_little_endian() -> None:
    x = _signal()
    expected = np.rint(x.astype(np.float64) * 32767).astype("<i2").tobytes()
    assert encode(x, "pcm_s16le") == expected
    assert encode(np.array([0.5], np.float32), "pcm_s16le") == (16384).to_bytes(2, "little")


def test_f32_is_little_endian() -> None:
    x = np.array([0.25, -0.5], np.float32)
    assert encode(x, "pcm_f32le") == x.astype("<f4").tobytes()


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_clips_and_silences_nan(encoding: Encoding) -> None:
    x = np.array([2.0, -2.0, np.nan, np.inf, -np.inf], np.float32)
    clipped = np.array([1.0, -1.0, 0.0, 1.0, -1.0], np.float32)
    assert encode(x, encoding) == encode(clipped, encoding)


@pytest.mark.parametrize(
    ("encoding", "tolerance"),
    [
        ("pcm_f32le", 0.0),
        ("pcm_s16le", 1.5 / 32768),
        ("mulaw", 1024 / 32768),
        ("alaw", 1024 / 32768),
    ],
)
def test_round_trip(encoding: Encoding, tolerance: float) -> None:
    x = _signal()
    y = decode(encode(x, encoding), encoding)
    assert y.dtype == np.float32
    assert len(y) == len(x)
    # the largest G.711 step is 1024 (mu-law) or 1024 (A-law) in 16-bit units
    assert np.max(np.abs(y - x)) <= tolerance


@pytest.mark.parametrize("encoding", list(G711))
def test_g711_sqnr(encoding: Encoding) -> None:
    """G.711 gives about 38 dB SQNR on a loud signal, independent of level."""
    x = np.sin(np.arange(8000) * 0.05).astype(np.float32) * 0.5
    y = decode(encode(x, encoding), encoding)
    sqnr = 10 * np.log10(np.sum(x**2) / np.sum((y - x) ** 2))
    assert sqnr > 35


@pytest.mark.parametrize("encoding", list(G711))
def test_every_code_is_a_fixed_point(encoding: Encoding) -> None:
    codes = bytes(range(256))
    again = encode(decode(codes, encoding), encoding)
    if encoding == "mulaw":  # 0x7F is "negative zero"; zero encodes as 0xFF
        codes = codes.replace(b"\x7f", b"\xff")
    assert again == codes


@pytest.mark.parametrize(
    ("encoding", "value", "code"),
    [
        ("mulaw", 0.0, 0xFF),
        ("mulaw", 1.0, 0x80),
        ("mulaw", -1.0, 0x00),
        ("alaw", 0.0, 0xD5),
        ("alaw", 1.0, 0xAA),
        ("alaw", -1.0, 0x2A),
    ],
)
def test_g711_known_codes(encoding: Encoding, value: float, code: int) -> None:
    assert encode(np.array([value], np.float32), encoding) == bytes([code])


@pytest.mark.parametrize("encoding", list(G711))
def test_g711_expansion_matches_libsndfile(encoding: Encoding) -> None:
    codes = bytes(range(256))
    expected = _libsndfile_decode(codes, G711[encoding])
    ours = decode(codes, encoding) * 32768
    np.testing.assert_array_equal(ours.astype(np.int16), expected)


def _levels(values: np.ndarray, encoding: Encoding) -> np.ndarray:
    """Index of each decoded value among the codec's sorted reconstruction levels."""
    levels = np.unique(decode(bytes(range(256)), encoding))
    return np.searchsorted(levels, values)


@pytest.mark.parametrize("encoding", list(G711))
def test_g711_compression_agrees_with_libsndfile(encoding: Encoding) -> None:
    """Same codes for every 16-bit input but negative decision levels.

    libsndfile truncates negative inputs towards zero where the G.191
    reference takes the one's complement, so at most one code apart there.
    """
    ints = np.arange(-32768, 32768, dtype=np.int64)
    x = (ints / 32767).astype(np.float32)  # encodes back to exactly ``ints``
    x = np.clip(x, -1.0, 1.0)
    ours = encode(x, encoding)
    theirs = _libsndfile_encode(np.clip(ints, -32767, 32767).astype(np.int16), G711[encoding])
    a = np.frombuffer(ours, np.uint8)
    b = np.frombuffer(theirs, np.uint8)
    differ = np.nonzero(a != b)[0]
    assert len(differ) <= 128
    assert np.all(ints[differ] < 0)
    level_gap = _levels(decode(ours, encoding), encoding) - _levels(
        decode(theirs, encoding), encoding
    )
    assert np.max(np.abs(level_gap)) <= 1


@pytest.mark.parametrize("encoding", list(G711))
def test_g711_float_input_close_to_libsndfile(encoding: Encoding) -> None:
    """libsndfile quantizes floats directly; we go through 16 bits: one level apart at most."""
    x = _signal()
    ours = decode(encode(x, encoding), encoding)
    theirs = decode(_libsndfile_encode(x, G711[encoding]), encoding)
    assert np.max(np.abs(_levels(ours, encoding) - _levels(theirs, encoding))) <= 1
    rms_ours = np.sqrt(np.mean((ours - x) ** 2))
    rms_theirs = np.sqrt(np.mean((theirs - x) ** 2))
    assert rms_ours <= rms_theirs * 1.02


def test_decode_rejects_partial_samples() -> None:
    with pytest.raises(ValueError, match="whole number"):
        decode(b"\x00\x01\x02", "pcm_s16le")


@given(
    x=hnp.arrays(np.float32, st.integers(0, 200), elements=st.floats(-4, 4, width=32)),
    encoding=st.sampled_from(ENCODINGS),
)
def test_any_input_encodes_to_in_range_samples(x: np.ndarray, encoding: Encoding) -> None:
    data = encode(x, encoding)
    assert len(data) == len(x) * bytes_per_sample(encoding)
    y = decode(data, encoding)
    assert len(y) == len(x)
    assert np.all(np.abs(y) <= 1.0)
    assert np.all(np.sign(y[np.abs(x) > 0.01]) == np.sign(x[np.abs(x) > 0.01]))
