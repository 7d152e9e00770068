"""The upstream relay's body decoding, at every split of the byte stream.

Fixtures follow the documented wire shapes: vllm-omni's ``docs/serving/
speech_api.md`` (raw PCM/WAV with ``stream_format: "audio"``; SSE with an
``event:`` line and a JSON ``data:`` line carrying ``speech.audio.delta``
``audio`` + ``response_format``, ``speech.audio.done`` with ``usage``,
``speech.audio.error`` with an ``error`` object), OpenAI's speech SSE
(``speech.audio.delta`` / ``speech.audio.done``), the older ``delta`` field
some servers send, and streamed WAV headers with ``0xFFFFFFFF`` sizes.
"""

from __future__ import annotations

import base64
import itertools
import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engines.base import WordTiming
from gateway.engines.upstream.wire import (
    Done,
    Event,
    Format,
    ResponseDecoder,
    Samples,
    StreamFormat,
    UpstreamAudioFormat,
    UpstreamFailure,
    WireError,
    word_timings,
)

RATE = 24000


def pcm16(n: int = 301, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return rng.integers(-32768, 32767, n, dtype=np.int16).astype("<i2").tobytes()


def fmt_chunk(rate: int, channels: int = 1, bits: int = 16, tag: int = 1) -> bytes:
    width = bits // 8
    body = struct.pack(
        "<HHIIHH", tag, channels, rate, rate * width * channels, width * channels, bits
    )
    return b"fmt " + struct.pack("<I", len(body)) + body


def wav_stream(
    data: bytes,
    *,
    rate: int = RATE,
    sizes: int | None = 0xFFFFFFFF,
    extra: bytes = b"",
    channels: int = 1,
    bits: int = 16,
    tag: int = 1,
) -> bytes:
    """A WAV body; ``sizes=None`` writes the true sizes."""
    head = fmt_chunk(rate, channels, bits, tag) + extra
    data_size = len(data) if sizes is None else sizes
    riff_size = 4 + len(head) + 8 + len(data) if sizes is None else sizes
    return (
        b"RIFF"
        + struct.pack("<I", riff_size)
        + b"WAVE"
        + head
        + b"data"
        + struct.pack("<I", data_size)
        + data
    )


def list_chunk() -> bytes:
    info = b"INFO" + b"ISFT" + struct.pack("<I", 13) + b"Lavf60.16.100\x00"  # odd: pad byte
    return b"LIST" + struct.pack("<I", len(info) - 1) + info[:-1] + b"\x00"


def sse(events: list[dict[str, object]], *, crlf: bool = False, named: bool = True) -> bytes:
    nl = "\r\n" if crlf else "\n"
    out = ""
    for event in events:
        if named:
            out += f"event: {event['type']}{nl}"
        out += f"data: {json.dumps(event)}{nl}{nl}"
    return out.encode()


def deltas(audio: bytes, field: str = "audio", pieces: int = 3) -> list[dict[str, object]]:
    step = max(1, len(audio) // pieces + 1)
    return [
        {
            "type": "speech.audio.delta",
            field: base64.b64encode(audio[i : i + step]).decode(),
            "response_format": "pcm",
        }
        for i in range(0, len(audio), step)
    ]


USAGE = {
    "input_tokens": 119,
    "output_tokens": 77,
    "total_tokens": 196,
    "input_token_details": {"text_tokens": 18, "audio_tokens": 101},
}

FIXTURES: dict[str, tuple[StreamFormat, UpstreamAudioFormat, bytes]] = {
    "pcm": ("audio", "pcm", pcm16()),
    "wav-open-sizes": ("audio", "wav", wav_stream(pcm16())),
    "wav-zero-sizes": ("audio", "wav", wav_stream(pcm16(), sizes=0)),
    "wav-true-sizes": ("audio", "wav", wav_stream(pcm16(), sizes=None)),
    "wav-list-chunk": ("audio", "wav", wav_stream(pcm16(), extra=list_chunk())),
    "wav-stereo": ("audio", "wav", wav_stream(pcm16(400), channels=2)),
    "wav-float": (
        "audio",
        "wav",
        wav_stream(np.linspace(-1, 1, 97, dtype="<f4").tobytes(), bits=32, tag=3),
    ),
    "wav-24bit": ("audio", "wav", wav_stream(pcm16(300)[:297], bits=24)),
    "sse-audio": (
        "sse",
        "pcm",
        sse([*deltas(pcm16()), {"type": "speech.audio.done", "usage": USAGE}]),
    ),
    "sse-delta-field": (
        "sse",
        "pcm",
        sse([*deltas(pcm16(), "delta"), {"type": "speech.audio.done"}], named=False),
    ),
    "sse-crlf": (
        "sse",
        "pcm",
        sse([*deltas(pcm16()), {"type": "speech.audio.done", "usage": USAGE}], crlf=True),
    ),
    "sse-wav": (
        "sse",
        "wav",
        sse([*deltas(wav_stream(pcm16()), pieces=5), {"type": "speech.audio.done"}]),
    ),
    "sse-error-partial": (
        "sse",
        "pcm",
        sse(
            [
                *deltas(pcm16(100)),
                {
                    "type": "speech.audio.error",
                    "partial_audio": True,
                    "error": {
                        "message": "stream boom",
                        "type": "server_error",
                        "param": None,
                        "code": 500,
                    },
                },
            ]
        ),
    ),
    "sse-done-marker": ("sse", "pcm", sse(deltas(pcm16()), named=False) + b"data: [DONE]\n\n"),
}


def decode(
    stream: StreamFormat, fmt: UpstreamAudioFormat, pieces: list[bytes]
) -> tuple[np.ndarray, list[Event], str | None]:
    decoder = ResponseDecoder(stream, fmt)
    events: list[Event] = []
    for piece in pieces:
        events.extend(decoder.push(piece))
    samples = [e.data for e in events if isinstance(e, Samples)]
    others = [e for e in events if not isinstance(e, Samples)]
    audio = np.concatenate(samples) if samples else np.zeros(0, np.float32)
    return audio, others, decoder.finish()


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("name", FIXTURES)
def test_every_single_split_and_every_byte(name: str) -> None:
    stream, fmt, data = FIXTURES[name]
    whole = decode(stream, fmt, [data])
    assert whole[0].size > 0
    for cut in range(len(data) + 1):
        parts = decode(stream, fmt, split_at(data, [cut]))
        np.testing.assert_array_equal(parts[0], whole[0])
        assert parts[1:] == whole[1:], cut
    byte_by_byte = decode(stream, fmt, [data[i : i + 1] for i in range(len(data))])
    np.testing.assert_array_equal(byte_by_byte[0], whole[0])
    assert byte_by_byte[1:] == whole[1:]


@pytest.mark.parametrize("name", FIXTURES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_partition(name: str, data: st.DataObject) -> None:
    stream, fmt, body = FIXTURES[name]
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=40))
    whole = decode(stream, fmt, [body])
    parts = decode(stream, fmt, split_at(body, cuts))
    np.testing.assert_array_equal(parts[0], whole[0])
    assert parts[1:] == whole[1:]


def test_pcm_values() -> None:
    raw = np.array([0, 16384, -32768, 32767], "<i2").tobytes()
    audio, events, end = decode("audio", "pcm", [raw[:3], raw[3:]])
    np.testing.assert_allclose(audio, [0, 0.5, -1, 32767 / 32768])
    assert events == [] and end is None


def test_wav_format_and_skipped_chunks() -> None:
    audio, events, end = decode("audio", "wav", [FIXTURES["wav-list-chunk"][2]])
    assert events == [Format(RATE, 1)]
    np.testing.assert_array_equal(audio, np.frombuffer(pcm16(), "<i2") / 32768.0)
    assert end is None
    stereo, events, _ = decode("audio", "wav", [FIXTURES["wav-stereo"][2]])
    assert events == [Format(RATE, 2)] and stereo.size == 200


def test_sized_data_chunk_ignores_trailing_bytes() -> None:
    body = wav_stream(pcm16(10), sizes=None) + b"JUNKxxxx"
    audio, _, end = decode("audio", "wav", [body])
    assert audio.size == 10 and end is None


def test_sse_events() -> None:
    audio, events, end = decode("sse", "pcm", [FIXTURES["sse-audio"][2]])
    assert events == [Done()] and end is None
    np.testing.assert_array_equal(audio, np.frombuffer(pcm16(), "<i2") / 32768.0)
    audio, events, end = decode("sse", "pcm", [FIXTURES["sse-error-partial"][2]])
    assert events == [UpstreamFailure("stream boom", partial_audio=True)]
    assert audio.size == 100 and end is None


def test_gateway_error_event_and_comments() -> None:
    body = b": keep-alive\n\n" + sse([{"type": "error", "error": {"message": "busy now"}}])
    _, events, _ = decode("sse", "pcm", [body])
    assert events == [UpstreamFailure("busy now", partial_audio=False)]


@pytest.mark.parametrize(
    ("stream", "fmt", "body", "problem"),
    [
        ("audio", "pcm", pcm16(3)[:5], "inside a sample"),
        ("audio", "wav", wav_stream(pcm16())[:30], "inside the WAV header"),
        ("sse", "pcm", sse(deltas(pcm16())), "without speech.audio.done"),
    ],
)
def test_truncated_bodies_are_reported(
    stream: StreamFormat, fmt: UpstreamAudioFormat, body: bytes, problem: str
) -> None:
    _, _, end = decode(stream, fmt, [body])
    assert end is not None and problem in end


@pytest.mark.parametrize(
    ("stream", "fmt", "body"),
    [
        ("audio", "wav", b"ID3\x04" + bytes(40)),
        ("audio", "wav", b"RIFF\xff\xff\xff\xffWAVE" + fmt_chunk(RATE, tag=85) + b"data"),
        ("audio", "wav", b"RIFF\xff\xff\xff\xffWAVEdata\xff\xff\xff\xff" + pcm16(4)),
        ("sse", "pcm", b"data: not json\n\n"),
        ("sse", "pcm", b'data: {"type": "speech.audio.delta", "audio": "!!"}\n\n'),
        ("sse", "pcm", b'data: {"type": "speech.audio.delta"}\n\n'),
    ],
)
def test_malformed_bodies_raise(
    stream: StreamFormat, fmt: UpstreamAudioFormat, body: bytes
) -> None:
    with pytest.raises(WireError):
        decode(stream, fmt, [body])


# --- X-Word-Timestamps (a whole file's words, vllm-omni 0.30) ----------------------------


@pytest.mark.parametrize(
    ("header", "words"),
    [
        (None, None),  # no header (0.30's oversize marker is another header)
        ("[]", ()),
        (
            '[{"word": "Hi", "start_ms": 0, "end_ms": 120.5}, {"word": "there", "start_ms": 130,'
            ' "end_ms": 400}]',
            (WordTiming("Hi", 0.0, 120.5), WordTiming("there", 130.0, 400.0)),
        ),
        ('[{"word": "caf\\u00e9", "start_ms": 1, "end_ms": 2}]', (WordTiming("café", 1, 2),)),
    ],
)
def test_word_timings(header: str | None, words: tuple[WordTiming, ...] | None) -> None:
    assert word_timings(header) == words


@pytest.mark.parametrize(
    "header",
    [
        "not json",
        '{"word": "Hi"}',
        '["Hi"]',
        '[{"word": "Hi", "start_ms": 5, "end_ms": 1}]',
        '[{"word": "Hi", "start_ms": -1, "end_ms": 1}]',
        '[{"word": "Hi", "start_ms": true, "end_ms": 1}]',
        '[{"word": 3, "start_ms": 0, "end_ms": 1}]',
        '[{"word": "Hi", "start_ms": 0}]',
        '[{"word": "Hi", "start_ms": 0, "end_ms": 1e400}]',
    ],
)
def test_word_timings_of_another_shape_are_a_wire_error(header: str) -> None:
    with pytest.raises(WireError):
        word_timings(header)
