"""Compressed and container response formats of the HTTP API, via libsndfile.

``ContainerEncoder`` turns float32 mono chunks into the bytes of one
``response_format`` (``mp3``, ``opus``, ``flac``, ``wav``, ``pcm``), either
as a *stream* (``push`` returns whatever bytes are final now, ``finish`` the
rest) or as a *complete file* (everything at ``finish``, with exact sizes).

libsndfile writes into a small in-memory file object.  Some encoders go back
and rewrite bytes they wrote earlier when the file is closed: MP3 fills in its
LAME/Xing tag frame, FLAC its STREAMINFO block.  A complete file keeps those
rewrites.  A stream cannot take back bytes already sent, so:

* ``mp3`` streams are constant bitrate, where libsndfile writes no VBR tag
  frame to patch (a decoder computes the length from the bitrate);
* ``flac`` streams keep the STREAMINFO written at the start, whose total
  sample count is 0, "unknown" in the FLAC specification (ffmpeg and browsers
  play it; libsndfile's reader needs the complete file);
* ``opus`` pages are flushed every ``OPUS_PAGE_LATENCY_MS``, not libsndfile's
  default of one second, so streamed Opus arrives as it is decoded;
* ``wav`` streams use the streaming header of ``gateway.audio.wav``.

What formats the installed libsndfile supports is checked once
(``format_support``); MP3 needs libsndfile 1.1 or newer.

Pure and synchronous: no asyncio; the only I/O is in memory.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, Literal, get_args

import numpy as np
import numpy.typing as npt
import soundfile as sf

from gateway.audio.encoding import encode
from gateway.audio.wav import wav_bytes, wav_header

#: the HTTP API's ``response_format`` values: whole-file containers (not
#: ``gateway.protocol.ResponseFormat``, the WebSocket's ``wav``/``pcm``)
ContainerFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
RESPONSE_FORMATS: tuple[ContainerFormat, ...] = get_args(ContainerFormat)

MEDIA_TYPES: Final[Mapping[str, str]] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}

#: (libsndfile major format, subtype) per container format
_SNDFILE: Final[Mapping[str, tuple[str, str]]] = {
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
    "flac": ("FLAC", "PCM_16"),
}

#: sample rates each format can be written at (``None``: any)
ALLOWED_RATES: Final[Mapping[str, tuple[int, ...] | None]] = {
    # libsndfile's Opus encoder: the rates Opus itself runs at
    "opus": (8000, 12000, 16000, 24000, 48000),
    # MPEG-1, 2 and 2.5 layer III
    "mp3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
    "flac": None,
    "wav": None,
    "pcm": None,
    "aac": None,
}

#: OpenAI's ``pcm`` is 24 kHz; the gateway uses that rate for every format by
#: default, so a client gets the same rate whatever it asks for
DEFAULT_RATE: Final = 24_000

OPUS_PAGE_LATENCY_MS: Final = 20.0

# libsndfile commands (sndfile.h)
_SFC_SET_OGG_PAGE_LATENCY_MS: Final = 0x1302
_SFC_SET_BITRATE_MODE: Final = 0x1305
_SF_BITRATE_MODE_CONSTANT: Final = 0


@dataclass(frozen=True)
class FormatSupport:
    libsndfile_version: str
    #: response format -> True when this process can produce it
    available: dict[str, bool]
    #: response format -> why it is unavailable
    reasons: dict[str, str]


@cache
def format_support() -> FormatSupport:
    """What the installed libsndfile can write (checked once per process)."""
    formats = sf.available_formats()
    available: dict[str, bool] = {"wav": True, "pcm": True}
    reasons: dict[str, str] = {
        "aac": "no AAC encoder is bundled (libsndfile has none)",
    }
    available["aac"] = False
    for name, (major, subtype) in _SNDFILE.items():
        ok = major in formats and subtype in sf.available_subtypes(major)
        available[name] = ok
        if not ok:
            reasons[name] = (
                f"libsndfile {sf.__libsndfile_version__} cannot write {major}/{subtype}"
                + (" (MP3 needs libsndfile >= 1.1)" if name == "mp3" else "")
            )
    return FormatSupport(sf.__libsndfile_version__, available, reasons)


def output_rate(response_format: str, native_rate: int, requested: int | None) -> int:
    """The rate a response is written at; raises ``ValueError`` if impossible."""
    allowed = ALLOWED_RATES[response_format]
    if requested is not None:
        if allowed is not None and requested not in allowed:
            rates = ", ".join(str(r) for r in allowed)
            raise ValueError(
                f"{response_format} cannot be written at {requested} Hz; use one of {rates}"
            )
        return requested
    return DEFAULT_RATE


class _Sink(io.RawIOBase):
    """A seekable in-memory file that remembers which bytes are final.

    In stream mode a write below the high-water mark (the encoder going back
    to patch a header) is dropped: those bytes have been sent already.
    """

    def __init__(self, stream: bool) -> None:
        super().__init__()
        self.stream = stream
        self.buf = bytearray()
        self.pos = 0
        self.sent = 0  #: bytes handed out by ``take``
        self.writes = 0

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.buf)}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer: Any) -> int:
        data = self.buf[self.pos : self.pos + len(buffer)]
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self.writes += 1
        end = self.pos + len(chunk)
        if self.stream and self.pos < len(self.buf):
            self.pos = end  # a patch of bytes already final: dropped
            return len(chunk)
        if end > len(self.buf):
            self.buf.extend(b"\x00" * (end - len(self.buf)))
        self.buf[self.pos : end] = chunk
        self.pos = end
        return len(chunk)

    def take(self) -> bytes:
        out = bytes(self.buf[self.sent :])
        self.sent = len(self.buf)
        return out


class ContainerEncoder:
    """Encode one response: ``push`` chunks, then ``finish`` once."""

    def __init__(self, response_format: str, sample_rate: int, *, stream: bool) -> None:
        if response_format not in RESPONSE_FORMATS or response_format == "aac":
            raise ValueError(f"cannot encode {response_format!r}")
        self.format = response_format
        self.sample_rate = sample_rate
        self.stream = stream
        self.samples = 0
        self._pending: list[npt.NDArray[np.float32]] = []  # complete wav only
        self._sink: _Sink | None = None
        self._file: sf.SoundFile | None = None
        self._started = False
        if response_format in _SNDFILE:
            major, subtype = _SNDFILE[response_format]
            self._sink = _Sink(stream)
            self._file = sf.SoundFile(
                self._sink, "w", samplerate=sample_rate, channels=1, format=major, subtype=subtype
            )
            if response_format == "opus":
                self._command(_SFC_SET_OGG_PAGE_LATENCY_MS, "double*", OPUS_PAGE_LATENCY_MS)
            if response_format == "mp3" and stream:
                self._command(_SFC_SET_BITRATE_MODE, "int*", _SF_BITRATE_MODE_CONSTANT)

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]

    def _command(self, command: int, ctype: str, value: float) -> None:
        from soundfile import _ffi, _snd  # libsndfile's sf_command via soundfile's cffi

        assert self._file is not None
        arg = _ffi.new(ctype, value)
        _snd.sf_command(self._file._file, command, arg, _ffi.sizeof(ctype[:-1]))

    def push(self, samples: npt.ArrayLike) -> bytes:
        """Encode a chunk; returns the bytes that are final now (stream mode)."""
        x = np.clip(np.nan_to_num(np.asarray(samples, dtype=np.float32)), -1.0, 1.0)
        self.samples += x.size
        head = b""
        if not self._started:
            self._started = True
            if self.stream and self.format == "wav":
                head = wav_header(self.sample_rate, "pcm_s16le", None)
        if self.format == "pcm":
            return encode(x, "pcm_s16le")
        if self.format == "wav":
            if self.stream:
                return head + encode(x, "pcm_s16le")
            self._pending.append(x)
            return b""
        assert self._file is not None and self._sink is not None
        if x.size:
            self._file.write(x)
        return self._take() if self.stream else b""

    def _take(self) -> bytes:
        assert self._sink is not None
        return self._sink.take()

    def finish(self) -> bytes:
        """The rest of the response (stream) or the whole file (complete)."""
        head = self.push(np.zeros(0, np.float32)) if not self._started else b""
        if self.format == "pcm":
            return head
        if self.format == "wav":
            if self.stream:
                return head
            audio = np.concatenate(self._pending) if self._pending else np.zeros(0, np.float32)
            return wav_bytes(audio, self.sample_rate, "pcm_s16le")
        assert self._file is not None and self._sink is not None
        self._file.close()
        if self.stream:
            return head + self._take()
        return bytes(self._sink.buf)

    def close(self) -> None:
        """Release libsndfile's handle without producing output (abort)."""
        if self._file is not None and not self._file.closed:
            self._file.close()
