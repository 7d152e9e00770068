"""WAV (RIFF/WAVE) containers for mono audio in every gateway encoding.

Two shapes are produced:

* a complete file (``wav_bytes``): header with exact sizes, the data, and the
  RIFF pad byte when the data has an odd length (mu-law or A-law with an odd
  sample count);
* a *streaming* header (``wav_header(..., data_bytes=None)``), sent before the
  sizes are known: the RIFF size, the ``data`` size and the ``fact`` sample
  count hold the placeholder ``0xFFFFFFFF``, which readers such as ffmpeg and
  libsndfile take as "up to the end of the stream".  A client that saves the
  header followed by every frame gets a playable file; one that wants exact
  sizes patches them after the last frame.

Layout: ``pcm_s16le`` uses the canonical 44-byte header (format tag 1, a
16-byte ``fmt`` chunk).  The other encodings are non-PCM formats in the WAVE
specification (tag 3 IEEE float, 7 mu-law, 6 A-law), so their ``fmt`` chunk
has the 18-byte form (``cbSize = 0``) and a ``fact`` chunk with the sample
count follows it: a 58-byte header.  Clients should read the chunk sizes
rather than assume 44 bytes.

This module is pure: it only builds bytes.
"""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt

from gateway.audio.encoding import Encoding, bytes_per_sample, encode

#: WAVE format tags (``wFormatTag``) by encoding
FORMAT_TAGS: dict[Encoding, int] = {
    "pcm_s16le": 1,  # WAVE_FORMAT_PCM
    "pcm_f32le": 3,  # WAVE_FORMAT_IEEE_FLOAT
    "alaw": 6,  # WAVE_FORMAT_ALAW
    "mulaw": 7,  # WAVE_FORMAT_MULAW
}

#: the size placeholder written where a streaming header does not know a size
UNKNOWN_SIZE = 0xFFFFFFFF

_CHANNELS = 1


def header_size(encoding: Encoding) -> int:
    """Length in bytes of the header ``wav_header`` returns for ``encoding``."""
    return 44 if FORMAT_TAGS[encoding] == 1 else 58


def wav_header(sample_rate: int, encoding: Encoding, data_bytes: int | None) -> bytes:
    """The RIFF/WAVE header for ``data_bytes`` bytes of mono ``encoding`` audio.

    ``data_bytes=None`` gives a streaming header whose sizes are the
    placeholder ``0xFFFFFFFF`` (see the module docstring).  With a known size,
    the RIFF size counts the pad byte that must follow odd-length data.
    """
    tag = FORMAT_TAGS[encoding]
    width = bytes_per_sample(encoding)
    if not 1 <= sample_rate <= 0xFFFFFFFF // width:
        raise ValueError(f"sample rate out of range: {sample_rate}")
    fmt = struct.pack(
        "<HHIIHH",
        tag,
        _CHANNELS,
        sample_rate,
        sample_rate * width * _CHANNELS,  # byte rate
        width * _CHANNELS,  # block align
        8 * width,  # bits per sample
    )
    chunks_before_data = b""
    if tag == 1:
        chunks_before_data = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    else:
        fmt += struct.pack("<H", 0)  # cbSize: no extra format bytes
        chunks_before_data = b"fmt " + struct.pack("<I", len(fmt)) + fmt
        frames = UNKNOWN_SIZE if data_bytes is None else data_bytes // width
        chunks_before_data += b"fact" + struct.pack("<II", 4, frames)

    if data_bytes is None:
        riff_size = data_size = UNKNOWN_SIZE
    else:
        if data_bytes < 0 or data_bytes % width:
            raise ValueError(f"{data_bytes} bytes is not a whole number of {encoding} samples")
        pad = data_bytes & 1
        riff_size = 4 + len(chunks_before_data) + 8 + data_bytes + pad
        if riff_size > UNKNOWN_SIZE - 1:
            raise ValueError(f"{data_bytes} bytes of audio is too long for a WAV file")
        data_size = data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff_size)
        + b"WAVE"
        + chunks_before_data
        + b"data"
        + struct.pack("<I", data_size)
    )


def wav_bytes(samples: npt.ArrayLike, sample_rate: int, encoding: Encoding) -> bytes:
    """A complete WAV file holding mono float ``samples`` encoded as ``encoding``."""
    data = encode(np.asarray(samples, dtype=np.float32), encoding)
    pad = b"\x00" if len(data) & 1 else b""
    return wav_header(sample_rate, encoding, len(data)) + data + pad
