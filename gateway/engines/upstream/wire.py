"""Decoding an upstream's streamed ``/v1/audio/speech`` body: pure, no I/O.

An upstream answers a streamed speech request in one of these shapes, and
every HTTP chunk boundary can fall anywhere in them (inside a 16-bit sample,
inside the WAV header, inside an SSE line or its base64):

* ``stream_format: "audio"`` + ``response_format: "pcm"``: raw signed 16-bit
  little-endian mono samples at the upstream's native rate (vllm-omni, OpenAI,
  this gateway).  A sample can be split across two chunks.
* ``stream_format: "audio"`` + ``response_format: "wav"``: a RIFF/WAVE header
  followed by PCM.  Streaming servers cannot know the sizes, so the RIFF and
  ``data`` sizes are often the placeholder ``0xFFFFFFFF`` (or 0); the ``data``
  chunk then runs to the end of the body.  Chunks before ``data`` that are not
  ``fmt `` (``LIST``, ``fact``, ...) are skipped.  Rate, channels and sample
  format come from ``fmt `` (PCM 16/24/32-bit or IEEE float 32; several
  channels are averaged to mono).
* ``stream_format: "sse"``: Server-Sent Events whose ``data:`` lines hold JSON:
  ``{"type": "speech.audio.delta", "audio": "<base64>"}`` (OpenAI, vllm-omni;
  some servers use the older field name ``delta`` instead of ``audio``), then
  ``{"type": "speech.audio.done", ...}``; on a failure
  ``{"type": "speech.audio.error", "error": {"message": ...}}`` (vllm-omni's
  documented shape), read with a ``"partial_audio": true`` flag when present
  (vllm-omni's streaming error messages carry one when audio was already
  sent; its HTTP documentation does not show it), or this gateway's
  ``{"type": "error", "error": {...}}``.  ``data: [DONE]`` is accepted as
  an end marker.  The base64 payloads concatenated are a PCM or
  WAV byte stream decoded as above.

A whole file (``stream: false``, asked for with vllm-omni 0.30's
``word_timestamps: true``) is read as ``stream_format: "audio"``: a sized
WAV or raw PCM; its ``X-Word-Timestamps`` header (``[{"word", "start_ms",
"end_ms"}]``, ms from the start of its audio) is read by ``word_timings``.

Before the body, the response's headers are checked (``check_headers``): a
``Content-Type`` that is not audio (a proxy's ``text/html`` error page, a
``200`` JSON error) or an ``X-Sample-Rate`` outside ``MIN_RATE`` to
``MAX_RATE`` is a ``WireError``, so nothing that is not audio is relayed as
PCM noise and one second of audio never becomes forty.  A WAV header's rate
has the same bounds.

``ResponseDecoder.push`` takes bytes as they arrive and returns events;
``finish`` says whether the body ended cleanly.  The decoded samples are
identical whatever the chunking (``tests/engine/test_upstream_wire.py`` checks
every split).  Work per call is linear in the bytes pushed and every buffer is
bounded (an SSE event beyond ``MAX_EVENT_BYTES``, a WAV header beyond
``MAX_HEADER_BYTES`` is a protocol error), so a call on the event loop costs
microseconds per kilobyte; nothing here blocks.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
import numpy as np
import numpy.typing as npt

from gateway.engines.base import WordTiming

StreamFormat = Literal["audio", "sse"]
#: the audio format the relay asks an upstream server for (its request's
#: ``response_format``); not ``gateway.protocol.ResponseFormat``
UpstreamAudioFormat = Literal["pcm", "wav"]

#: a WAV header (every chunk before ``data`` except skipped ones) this large is
#: not a WAV stream
MAX_HEADER_BYTES = 64 * 1024
#: one SSE event (its ``data:`` lines) this large is refused; 4 MiB of base64
#: is 1.5 MiB of audio, about 30 s at 24 kHz
MAX_EVENT_BYTES = 4 * 1024 * 1024
#: the sample rates an upstream may declare (``X-Sample-Rate``, a WAV
#: header): the bounds ``upstream.native_rate`` has
MIN_RATE = 8000
MAX_RATE = 192_000
#: a body in ``stream_format: "audio"`` must be declared as one of these (or
#: not declared at all): vllm-omni and this gateway send ``audio/pcm`` and
#: ``audio/wav``, some servers ``application/octet-stream``
AUDIO_TYPES = ("audio/", "application/octet-stream")
#: ``stream_format: "sse"`` bodies
SSE_TYPE = "text/event-stream"
#: placeholder sizes meaning "until the end of the stream"
_OPEN_SIZES = (0xFFFFFFFF, 0)

_WAVE_FORMAT_PCM = 1
_WAVE_FORMAT_IEEE_FLOAT = 3
_WAVE_FORMAT_EXTENSIBLE = 0xFFFE
#: a line ends at CRLF, LF or CR (a CR at a chunk's end may be half a CRLF)
_LINE_END = re.compile(rb"\r\n|\n|\r")


class WireError(ValueError):
    """The body is not in the shape its request asked for."""


@dataclass(frozen=True)
class Format:
    """The audio's rate, known from a WAV header (PCM bodies have none)."""

    sample_rate: int
    channels: int


@dataclass(frozen=True)
class Samples:
    """Float32 mono samples in [-1, 1]."""

    data: npt.NDArray[np.float32]


@dataclass(frozen=True)
class Done:
    """The upstream said the audio is complete (SSE ``speech.audio.done``)."""


@dataclass(frozen=True)
class UpstreamFailure:
    """The upstream reported a failure in the body (SSE error event)."""

    message: str
    #: the upstream says it had already sent audio of this request
    partial_audio: bool


Event = Format | Samples | Done | UpstreamFailure


# --- headers -------------------------------------------------------------------------


def check_headers(
    content_type: str | None, sample_rate: str | None, stream_format: StreamFormat
) -> int:
    """A successful response's ``Content-Type`` and ``X-Sample-Rate``
    checked before its body is read: the declared rate (0 when none is
    declared), or ``WireError`` when the body is declared as something that
    is not speech audio in ``stream_format`` or at an impossible rate.  A
    missing ``Content-Type`` is accepted (the body's own shape is checked as
    it comes)."""
    kind = (content_type or "").split(";")[0].strip().casefold()
    if kind:
        wanted = (SSE_TYPE,) if stream_format == "sse" else AUDIO_TYPES
        if not any(kind == w or (w.endswith("/") and kind.startswith(w)) for w in wanted):
            raise WireError(f"the body is {kind[:60]}, not {' or '.join(wanted)}")
    if sample_rate is None:
        return 0
    raw = sample_rate.strip()
    if not raw.isdigit() or not MIN_RATE <= int(raw) <= MAX_RATE:
        raise WireError(
            f"X-Sample-Rate {raw[:20]!r} is not a rate from {MIN_RATE} to {MAX_RATE} Hz"
        )
    return int(raw)


#: a time in a file's audio: at most a day (a number JSON writes as 1e400 is not one)
_Ms = Annotated[float, msgspec.Meta(ge=0, le=86_400_000)]


class _Word(msgspec.Struct):
    """One entry of ``X-Word-Timestamps`` (other keys ignored)."""

    word: str
    start_ms: _Ms
    end_ms: _Ms


_words_decoder = msgspec.json.Decoder(list[_Word])


def word_timings(header: str | None) -> tuple[WordTiming, ...] | None:
    """vllm-omni 0.30's ``X-Word-Timestamps`` (``[{"word", "start_ms",
    "end_ms"}]``, ms from the start of the file's audio): the words, or None
    without the header (0.30 replaces one over 4 KB by
    ``X-Word-Timestamps-Omitted``).  ``WireError`` when it is not that shape."""
    if header is None:
        return None
    try:
        entries = _words_decoder.decode(header)
    except msgspec.DecodeError as exc:
        raise WireError(f"X-Word-Timestamps is not [{{word, start_ms, end_ms}}]: {exc}") from None
    if any(w.end_ms < w.start_ms for w in entries):
        raise WireError("an X-Word-Timestamps entry ends before it starts")
    return tuple(WordTiming(w.word, w.start_ms, w.end_ms) for w in entries)


# --- PCM -----------------------------------------------------------------------------


class PcmDecoder:
    """Little-endian integer or float samples, interleaved channels, to mono
    float32.  Keeps the bytes of an incomplete frame for the next push."""

    def __init__(self, sample_width: int = 2, channels: int = 1, floating: bool = False) -> None:
        if floating and sample_width != 4:
            raise WireError("float samples must be 32-bit")
        if sample_width not in (1, 2, 3, 4):
            raise WireError(f"unsupported sample width: {sample_width} bytes")
        if channels < 1:
            raise WireError("a stream needs at least one channel")
        self.sample_width = sample_width
        self.channels = channels
        self.floating = floating
        self._frame = sample_width * channels
        self._rest = b""

    @property
    def pending(self) -> int:
        """Bytes held of an incomplete frame."""
        return len(self._rest)

    def push(self, data: bytes) -> npt.NDArray[np.float32]:
        if self._rest:
            data = self._rest + data
        whole = len(data) - len(data) % self._frame
        self._rest = data[whole:]
        return self._convert(data[:whole])

    def _convert(self, data: bytes) -> npt.NDArray[np.float32]:
        width = self.sample_width
        if not data:
            return np.zeros(0, np.float32)
        if self.floating:
            samples = np.frombuffer(data, "<f4").astype(np.float32)
        elif width == 1:  # WAV 8-bit is unsigned
            samples = (np.frombuffer(data, np.uint8).astype(np.float32) - 128.0) / 128.0
        elif width == 2:
            samples = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
        elif width == 3:
            raw = np.frombuffer(data, np.uint8).reshape(-1, 3).astype(np.int32)
            values = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
            values = np.where(values >= 1 << 23, values - (1 << 24), values)
            samples = values.astype(np.float32) / float(1 << 23)
        else:
            samples = np.frombuffer(data, "<i4").astype(np.float32) / float(1 << 31)
        if self.channels > 1:
            samples = samples.reshape(-1, self.channels).mean(axis=1, dtype=np.float32)
        return np.clip(samples, -1.0, 1.0).astype(np.float32, copy=False)


# --- WAV -----------------------------------------------------------------------------


class WavDecoder:
    """A streamed RIFF/WAVE body: header (sizes may be placeholders), then
    samples.  ``push`` returns a ``Format`` once, then ``Samples``."""

    def __init__(self) -> None:
        self._buffer = b""
        self._header_seen = 0  #: header bytes consumed, for the bound
        self._riff_checked = False
        self._skip = 0  #: bytes of an unknown chunk still to skip
        self._format: Format | None = None
        self._pcm: PcmDecoder | None = None
        self._data_left: int | None = None  #: None: open-ended data chunk
        self._in_data = False

    @property
    def format(self) -> Format | None:
        return self._format

    @property
    def pending(self) -> int:
        """Bytes held that were not yet turned into samples."""
        held = len(self._buffer)
        return held + (self._pcm.pending if self._pcm is not None else 0)

    @property
    def started(self) -> bool:
        """The ``data`` chunk was reached."""
        return self._in_data

    def push(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        if self._in_data:
            self._data(data, events)
            return events
        self._buffer += data
        self._header(events)
        return events

    def _data(self, data: bytes, events: list[Event]) -> None:
        assert self._pcm is not None
        if self._data_left is not None:
            data = data[: self._data_left]  # anything after a sized data chunk is ignored
            self._data_left -= len(data)
        samples = self._pcm.push(data)
        if samples.size:
            events.append(Samples(samples))

    def _take(self, n: int) -> bytes | None:
        if len(self._buffer) < n:
            return None
        head, self._buffer = self._buffer[:n], self._buffer[n:]
        self._header_seen += n
        if self._header_seen > MAX_HEADER_BYTES:
            raise WireError("the WAV header is too large")
        return head

    def _header(self, events: list[Event]) -> None:
        if not self._riff_checked:
            riff = self._take(12)
            if riff is None:
                return
            if riff[:4] != b"RIFF" or riff[8:12] != b"WAVE":
                raise WireError("the body is not a RIFF/WAVE stream")
            self._riff_checked = True
        while True:
            if self._skip:
                dropped = min(self._skip, len(self._buffer))
                self._buffer = self._buffer[dropped:]
                self._skip -= dropped
                if self._skip:
                    return
            if len(self._buffer) < 8:
                return
            chunk_id, size = self._buffer[:4], struct.unpack("<I", self._buffer[4:8])[0]
            if chunk_id == b"data":
                self._take(8)
                if self._pcm is None:
                    raise WireError("the WAV data chunk comes before its fmt chunk")
                self._in_data = True
                self._data_left = None if size in _OPEN_SIZES else size
                rest, self._buffer = self._buffer, b""
                if rest:
                    self._data(rest, events)
                return
            if chunk_id == b"fmt ":
                if size < 16 or size > 1024:
                    raise WireError("the WAV fmt chunk has an impossible size")
                body = self._take(8 + size + size % 2)
                if body is None:
                    return
                events.append(self._parse_fmt(body[8 : 8 + size]))
                continue
            # LIST, fact, JUNK...: skipped without buffering, pad byte included
            self._take(8)
            if size == 0xFFFFFFFF:
                raise WireError(f"the WAV {chunk_id!r} chunk has no size")
            self._skip = size + size % 2

    def _parse_fmt(self, body: bytes) -> Format:
        tag, channels, rate, _byte_rate, _align, bits = struct.unpack("<HHIIHH", body[:16])
        if tag == _WAVE_FORMAT_EXTENSIBLE and len(body) >= 26:
            tag = struct.unpack("<H", body[24:26])[0]  # the sub-format GUID's first field
        if tag not in (_WAVE_FORMAT_PCM, _WAVE_FORMAT_IEEE_FLOAT):
            raise WireError(f"WAV format tag {tag} is not PCM or float")
        if not MIN_RATE <= rate <= MAX_RATE:
            raise WireError(f"WAV sample rate {rate} Hz is out of range")
        if bits % 8 or not 8 <= bits <= 32:
            raise WireError(f"WAV samples of {bits} bits are not supported")
        self._pcm = PcmDecoder(bits // 8, channels, floating=tag == _WAVE_FORMAT_IEEE_FLOAT)
        self._format = Format(rate, channels)
        return self._format


# --- SSE -----------------------------------------------------------------------------


class SseDecoder:
    """Server-Sent Events (WHATWG): lines ending in LF, CRLF or CR; ``data:``
    fields of one event joined by LF; a blank line dispatches.  Returns each
    event's data as text."""

    def __init__(self) -> None:
        self._line = bytearray()
        self._data: list[str] = []
        self._size = 0
        self._after_cr = False

    def push(self, chunk: bytes) -> list[str]:
        out: list[str] = []
        if not chunk:
            return out
        start = 0
        if self._after_cr and chunk[:1] == b"\n":
            start = 1  # the LF of a CRLF whose CR ended the previous chunk
        self._after_cr = False
        for match in _LINE_END.finditer(chunk, start):
            self._line += chunk[start : match.start()]
            self._end_line(out)
            start = match.end()
        self._line += chunk[start:]
        self._after_cr = chunk.endswith(b"\r")
        if len(self._line) > MAX_EVENT_BYTES:
            raise WireError("an SSE line is too long")
        return out

    def _end_line(self, out: list[str]) -> None:
        line = self._line.decode("utf-8", errors="replace")
        self._line = bytearray()
        if not line:
            if self._data:
                out.append("\n".join(self._data))
            self._data, self._size = [], 0
            return
        if line.startswith(":"):
            return  # a comment (keep-alive)
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._size += len(value)
            if self._size > MAX_EVENT_BYTES:
                raise WireError("an SSE event is too large")
            self._data.append(value)
        # event:, id:, retry: carry nothing the relay needs: the JSON has the type

    @property
    def pending(self) -> bool:
        """An event was started and not dispatched."""
        return bool(self._data or self._line)


def _error_message(event: dict[str, object]) -> str:
    error = event.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str) and message:
            return message
    elif isinstance(error, str) and error:
        return error
    message = event.get("message")
    return message if isinstance(message, str) and message else "the upstream reported an error"


# --- the whole body ------------------------------------------------------------------


class ResponseDecoder:
    """One streamed speech response, as ``push``-ed bytes, to events."""

    def __init__(self, stream_format: StreamFormat, response_format: UpstreamAudioFormat) -> None:
        self.stream_format = stream_format
        self.response_format = response_format
        self._sse = SseDecoder() if stream_format == "sse" else None
        self._wav = WavDecoder() if response_format == "wav" else None
        self._pcm = PcmDecoder() if response_format == "pcm" else None
        self.ended = False  #: a done, error or [DONE] event was seen
        self.failed = False

    def push(self, data: bytes) -> list[Event]:
        if self._sse is None:
            return self._audio(data)
        events: list[Event] = []
        for text in self._sse.push(data):
            if self.ended:
                continue  # nothing after the end counts
            events.extend(self._sse_event(text))
        return events

    def _audio(self, data: bytes) -> list[Event]:
        if self._wav is not None:
            return self._wav.push(data)
        assert self._pcm is not None
        samples = self._pcm.push(data)
        return [Samples(samples)] if samples.size else []

    def _sse_event(self, text: str) -> list[Event]:
        if text.strip() == "[DONE]":
            self.ended = True
            return [Done()]
        try:
            event = json.loads(text)
        except json.JSONDecodeError:
            raise WireError("an SSE event is not JSON") from None
        if not isinstance(event, dict):
            raise WireError("an SSE event is not a JSON object")
        kind = event.get("type")
        if kind == "speech.audio.delta":
            encoded = event.get("audio", event.get("delta"))
            if not isinstance(encoded, str):
                raise WireError("a speech.audio.delta event has no audio")
            try:
                audio = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise WireError("a speech.audio.delta event's audio is not base64") from None
            return self._audio(audio)
        if kind == "speech.audio.done":
            self.ended = True
            return [Done()]
        if kind in ("speech.audio.error", "error"):
            self.ended = self.failed = True
            return [UpstreamFailure(_error_message(event), event.get("partial_audio") is True)]
        return []  # transcript.*, response.subtitle...: not audio

    def finish(self) -> str | None:
        """The body ended; None if it ended cleanly, else what was wrong."""
        if self._sse is not None and not self.ended:
            return "the event stream ended without speech.audio.done"
        if self.failed:
            return None  # the failure event said what went wrong
        if self._wav is not None and not self._wav.started:
            return "the body ended inside the WAV header"
        decoder = self._wav if self._wav is not None else self._pcm
        if decoder is not None and decoder.pending:
            return "the body ended inside a sample"
        return None
