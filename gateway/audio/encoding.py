"""Sample encodings: float32 audio in, wire bytes out (and back, for clients).

The gateway works on float32 mono samples in -1..1 everywhere; this module is
the one place where they become the bytes a client asked for:

* ``pcm_s16le``: signed 16-bit little-endian, ``round(x * 32767)`` (the scale
  libsndfile uses, so our bytes equal ``soundfile``'s ``PCM_16`` output);
* ``pcm_f32le``: IEEE float32 little-endian;
* ``mulaw`` and ``alaw``: ITU-T G.711, one byte per sample, computed from the
  16-bit value above with the reference segment tables (the algorithm of the
  CCITT/Sun ``g711.c`` reference code), as lookup tables built once at import.

Input is clipped to -1..1 and NaN becomes 0 (silence) before encoding, so a
misbehaving model can never produce wrapped-around integers.  ``decode`` maps
integer codes back with the scale ``1 / 32768``, as libsndfile does.

This module is pure: no I/O, no asyncio, no state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

Encoding = Literal["pcm_s16le", "pcm_f32le", "mulaw", "alaw"]

#: every encoding, in protocol order (for validation and parametrized tests)
ENCODINGS: tuple[Encoding, ...] = get_args(Encoding)

_BYTES_PER_SAMPLE: dict[Encoding, int] = {
    "pcm_s16le": 2,
    "pcm_f32le": 4,
    "mulaw": 1,
    "alaw": 1,
}

_S16_ENCODE_SCALE = 32767.0
_S16_DECODE_SCALE = 1.0 / 32768.0


def bytes_per_sample(encoding: Encoding) -> int:
    """Bytes one mono sample takes on the wire in ``encoding``."""
    try:
        return _BYTES_PER_SAMPLE[encoding]
    except KeyError:
        raise ValueError(f"unknown encoding {encoding!r}; expected one of {ENCODINGS}") from None


# --- G.711 reference algorithms (scalar, used only to build the tables) -------
#
# The compressors follow the ITU-T G.191 Software Tool Library (``g711.c``):
# the 16-bit input is reduced to its 14 (mu-law) or 13 (A-law) most
# significant bits, and a negative value is taken as its one's complement,
# so x and -x-1 always get mirror-image codes.  (libsndfile truncates negative
# values towards zero instead; the two differ by one code, only for negative
# inputs that sit exactly on a decision level.)  The expanders are the
# classic tables every implementation shares.

_SEG_SHIFT = 4
_QUANT_MASK = 0x0F
_SIGN_BIT = 0x80
_ULAW_BIAS = 0x84  # 132: the mu-law bias in 16-bit units (33 in 14-bit units)


def _linear_to_ulaw(pcm: int) -> int:
    magnitude = ((~pcm if pcm < 0 else pcm) >> 2) + 33
    magnitude = min(magnitude, 0x1FFF)
    segment = 1
    rest = magnitude >> 6
    while rest:
        segment += 1
        rest >>= 1
    code = ((8 - segment) << 4) | (0x0F - ((magnitude >> segment) & 0x0F))
    return code | _SIGN_BIT if pcm >= 0 else code


def _linear_to_alaw(pcm: int) -> int:
    magnitude = (~pcm if pcm < 0 else pcm) >> 4  # 0..2047
    if magnitude > 15:
        exponent = 1
        while magnitude > 16 + 15:
            magnitude >>= 1
            exponent += 1
        magnitude += (exponent << 4) - 16
    code = magnitude | _SIGN_BIT if pcm >= 0 else magnitude
    return code ^ 0x55


def _ulaw_to_linear(code: int) -> int:
    code = ~code & 0xFF
    t = (((code & _QUANT_MASK) << 3) + _ULAW_BIAS) << ((code & 0x70) >> _SEG_SHIFT)
    return _ULAW_BIAS - t if code & _SIGN_BIT else t - _ULAW_BIAS


def _alaw_to_linear(code: int) -> int:
    code ^= 0x55
    t = (code & _QUANT_MASK) << 4
    seg = (code & 0x70) >> _SEG_SHIFT
    if seg == 0:
        t += 8
    elif seg == 1:
        t += 0x108
    else:
        t = (t + 0x108) << (seg - 1)
    return t if code & _SIGN_BIT else -t


def _encode_table(fn: Callable[[int], int]) -> npt.NDArray[np.uint8]:
    # indexed by the int16 value reinterpreted as uint16
    values = np.arange(65536, dtype=np.uint16).view(np.int16)
    return np.array([fn(int(v)) for v in values], dtype=np.uint8)


def _decode_table(fn: Callable[[int], int]) -> npt.NDArray[np.int16]:
    return np.array([fn(code) for code in range(256)], dtype=np.int16)


_ULAW_ENCODE = _encode_table(_linear_to_ulaw)
_ALAW_ENCODE = _encode_table(_linear_to_alaw)
_ULAW_DECODE = _decode_table(_ulaw_to_linear)
_ALAW_DECODE = _decode_table(_alaw_to_linear)


# --- public API ---------------------------------------------------------------


def _to_int16(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.int16]:
    scaled = np.rint(samples.astype(np.float64) * _S16_ENCODE_SCALE)
    return scaled.astype(np.int16)


def encode(samples: npt.ArrayLike, encoding: Encoding) -> bytes:
    """Encode mono float samples (nominally -1..1) as ``encoding`` bytes.

    Values are clipped to -1..1 and NaN becomes 0.  ``pcm_s16le`` rounds to
    the nearest integer (ties to even).
    """
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"expected mono samples (1-D), got shape {x.shape}")
    x = np.clip(np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
    if encoding == "pcm_f32le":
        return x.astype("<f4", copy=False).tobytes()
    if encoding == "pcm_s16le":
        return _to_int16(x).astype("<i2", copy=False).tobytes()
    if encoding == "mulaw":
        return _ULAW_ENCODE[_to_int16(x).view(np.uint16)].tobytes()
    if encoding == "alaw":
        return _ALAW_ENCODE[_to_int16(x).view(np.uint16)].tobytes()
    raise ValueError(f"unknown encoding {encoding!r}; expected one of {ENCODINGS}")


def decode(data: bytes | bytearray | memoryview, encoding: Encoding) -> npt.NDArray[np.float32]:
    """Decode ``encoding`` bytes back to mono float32 samples (for clients, tests)."""
    width = bytes_per_sample(encoding)
    if len(data) % width:
        raise ValueError(f"{len(data)} bytes is not a whole number of {encoding} samples")
    if encoding == "pcm_f32le":
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if encoding == "pcm_s16le":
        ints = np.frombuffer(data, dtype="<i2")
    else:
        table = _ULAW_DECODE if encoding == "mulaw" else _ALAW_DECODE
        ints = table[np.frombuffer(data, dtype=np.uint8)]
    return (ints.astype(np.float32) * np.float32(_S16_DECODE_SCALE)).astype(np.float32)
