"""WAV containers: every encoding validated by libsndfile, streaming headers included."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest
import soundfile as sf

from gateway.audio.encoding import ENCODINGS, Encoding, bytes_per_sample, decode, encode
from gateway.audio.wav import FORMAT_TAGS, UNKNOWN_SIZE, header_size, wav_bytes, wav_header

SUBTYPES: dict[Encoding, str] = {
    "pcm_s16le": "PCM_16",
    "pcm_f32le": "FLOAT",
    "mulaw": "ULAW",
    "alaw": "ALAW",
}


def _tone(n: int) -> np.ndarray:
    return np.asarray(0.6 * np.sin(np.arange(n) * 0.07), dtype=np.float32)


def _read(data: bytes) -> tuple[np.ndarray, int, str]:
    info = sf.info(io.BytesIO(data))
    samples, rate = sf.read(io.BytesIO(data), dtype="float32")
    return np.asarray(samples), int(rate), str(info.subtype)


def test_format_tags() -> None:
    assert FORMAT_TAGS == {"pcm_s16le": 1, "pcm_f32le": 3, "mulaw": 7, "alaw": 6}


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("n", [0, 1, 1001, 16000])
def test_complete_file_is_valid(encoding: Encoding, n: int) -> None:
    x = _tone(n)
    data = wav_bytes(x, 22050, encoding)
    samples, rate, subtype = _read(data)
    assert (rate, subtype, len(samples)) == (22050, SUBTYPES[encoding], n)
    np.testing.assert_array_equal(samples, decode(encode(x, encoding), encoding))
    # RIFF rules: even total length (pad byte), sizes that add up
    assert len(data) % 2 == 0
    assert struct.unpack_from("<I", data, 4)[0] == len(data) - 8
    assert struct.unpack_from("<H", data, 20)[0] == FORMAT_TAGS[encoding]
    assert data[header_size(encoding) - 8 : header_size(encoding) - 4] == b"data"
    assert struct.unpack_from("<I", data, header_size(encoding) - 4)[0] == n * bytes_per_sample(
        encoding
    )


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_header_fields(encoding: Encoding) -> None:
    width = bytes_per_sample(encoding)
    header = wav_header(8000, encoding, 10 * width)
    assert len(header) == header_size(encoding)
    tag, channels, rate, byte_rate, align, bits = struct.unpack_from("<HHIIHH", header, 20)
    assert (tag, channels, rate, byte_rate, align, bits) == (
        FORMAT_TAGS[encoding],
        1,
        8000,
        8000 * width,
        width,
        8 * width,
    )
    if encoding == "pcm_s16le":
        assert len(header) == 44
    else:  # non-PCM: 18-byte fmt (cbSize 0) and a fact chunk with the sample count
        assert struct.unpack_from("<I", header, 16)[0] == 18
        assert header[38:42] == b"fact"
        assert struct.unpack_from("<II", header, 42) == (4, 10)


def test_s16_file_reads_with_the_standard_library() -> None:
    x = _tone(500)
    with wave.open(io.BytesIO(wav_bytes(x, 16000, "pcm_s16le"))) as reader:
        assert (reader.getframerate(), reader.getnchannels(), reader.getsampwidth()) == (
            16000,
            1,
            2,
        )
        assert reader.readframes(500) == encode(x, "pcm_s16le")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_streaming_header_then_frames_is_playable(encoding: Encoding) -> None:
    header = wav_header(24000, encoding, None)
    assert len(header) == header_size(encoding)
    assert struct.unpack_from("<I", header, 4)[0] == UNKNOWN_SIZE
    assert struct.unpack_from("<I", header, len(header) - 4)[0] == UNKNOWN_SIZE
    x = _tone(4801)
    frames = [encode(x[i : i + 480], encoding) for i in range(0, len(x), 480)]
    samples, rate, subtype = _read(header + b"".join(frames))
    assert (rate, subtype) == (24000, SUBTYPES[encoding])
    np.testing.assert_array_equal(samples, decode(encode(x, encoding), encoding))


def test_rejects_partial_samples_and_bad_rates() -> None:
    with pytest.raises(ValueError, match="whole number"):
        wav_header(8000, "pcm_s16le", 3)
    with pytest.raises(ValueError, match="sample rate"):
        wav_header(0, "mulaw", 0)
