"""Frame grid and tagged binary headers."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.audio.framing import (
    HEADER_SIZE,
    FrameFlags,
    Framer,
    TaggedHeader,
    frame_start,
    pack_header,
    unpack_frame,
)


@pytest.mark.parametrize(
    ("rate", "frame_ms", "starts"),
    [
        (8000, 20, [0, 160, 320, 480]),
        (22050, 20, [0, 441, 882, 1323]),
        (22050, 10, [0, 221, 441, 662, 882]),  # 220.5 and 661.5 round half up
        (44100, 15, [0, 662, 1323, 1985]),  # 661.5, 1984.5
        (16000, 500, [0, 8000, 16000]),
    ],
)
def test_frame_start_formula(rate: int, frame_ms: int, starts: list[int]) -> None:
    assert [frame_start(k, rate, frame_ms) for k in range(len(starts))] == starts


def test_grid_never_drifts() -> None:
    # one hour of 10 ms frames at 22050 Hz ends exactly on the hour
    assert frame_start(360_000, 22050, 10) == 3600 * 22050


@st.composite
def _chunked(draw: st.DrawFn) -> tuple[int, int, np.ndarray, list[int]]:
    rate = draw(
        st.sampled_from([8000, 11025, 16000, 22050, 24000, 44100, 48000]) | st.integers(8000, 48000)
    )
    frame_ms = draw(st.integers(10, 500))
    total = draw(st.integers(0, 30_000))
    cuts = sorted(draw(st.lists(st.integers(0, total), max_size=12)))
    samples = np.arange(total, dtype=np.float32) / 65536.0  # distinct, order-revealing
    return rate, frame_ms, samples, cuts


@settings(max_examples=150, deadline=None)
@given(case=_chunked(), sentences=st.integers(1, 2))
def test_frames_concatenate_to_input_for_any_chunking(
    case: tuple[int, int, np.ndarray, list[int]], sentences: int
) -> None:
    rate, frame_ms, samples, cuts = case
    framer = Framer(rate, frame_ms)
    for _ in range(sentences):  # the grid restarts at frame 0 after each flush
        frames: list[np.ndarray] = []
        for chunk in np.split(samples, cuts):
            frames.extend(framer.push(chunk))
        rest = framer.flush()
        for k, frame in enumerate(frames):
            assert len(frame) == frame_start(k + 1, rate, frame_ms) - frame_start(k, rate, frame_ms)
        if rest is not None:
            assert (
                0
                < len(rest)
                < frame_start(len(frames) + 1, rate, frame_ms)
                - frame_start(len(frames), rate, frame_ms)
            )
        pieces = [*frames, rest] if rest is not None else frames
        joined = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        np.testing.assert_array_equal(joined, samples)
        assert framer.frame_index == 0
        assert framer.pending_samples == 0


def test_push_returns_complete_frames_only() -> None:
    framer = Framer(8000, 20)
    assert framer.push(np.zeros(100, np.float32)) == []
    assert framer.pending_samples == 100
    frames = framer.push(np.ones(300, np.float32))
    assert [len(f) for f in frames] == [160, 160]
    assert framer.frame_index == 2
    rest = framer.flush()
    assert rest is not None and len(rest) == 80
    assert framer.flush() is None


def test_frames_do_not_alias_the_callers_buffer() -> None:
    framer = Framer(8000, 10)
    buffer = np.ones(100, np.float32)
    framer.push(buffer)
    buffer[:] = 0
    rest = framer.flush()
    assert rest is not None and np.all(rest == 1)


def test_rejects_empty_frames_and_stereo() -> None:
    with pytest.raises(ValueError, match="invalid frame grid"):
        Framer(8000, 0)
    with pytest.raises(ValueError, match="no sample"):
        Framer(100, 5)
    with pytest.raises(ValueError, match="mono"):
        Framer(8000, 20).push(np.zeros((4, 2), np.float32))


# --- tagged header ------------------------------------------------------------------


def test_header_layout_byte_by_byte() -> None:
    header = TaggedHeader(
        context=0x0102,
        utterance_index=0x03040506,
        sequence=0x0708090A,
        sample_offset=0x0B0C0D0E0F101112,
        flags=FrameFlags.FIRST | FrameFlags.WAV_HEADER,
    )
    data = pack_header(header)
    assert HEADER_SIZE == len(data) == 20
    assert data == bytes.fromhex(
        "01 05 0201 06050403 0a090807 1211100f0e0d0c0b"  # version flags ctx utt seq off
    )
    assert data == struct.pack("<BBHIIQ", 1, 5, 0x0102, 0x03040506, 0x0708090A, 0x0B0C0D0E0F101112)


@given(
    context=st.integers(0, 2**16 - 1),
    utterance=st.integers(0, 2**32 - 1),
    sequence=st.integers(0, 2**32 - 1),
    offset=st.integers(0, 2**64 - 1),
    flags=st.integers(0, 255),
    payload=st.binary(max_size=64),
)
def test_header_round_trip(
    context: int, utterance: int, sequence: int, offset: int, flags: int, payload: bytes
) -> None:
    header = TaggedHeader(context, utterance, sequence, offset, FrameFlags(flags))
    parsed, view = unpack_frame(pack_header(header) + payload)
    assert parsed == header
    assert view.tobytes() == payload
    assert int(parsed.flags) == flags  # reserved bits are kept, not rejected


def test_unpack_rejects_short_and_unknown_versions() -> None:
    good = pack_header(TaggedHeader(0, 0, 0, 0))
    with pytest.raises(ValueError, match="too short"):
        unpack_frame(good[:19])
    with pytest.raises(ValueError, match="too short"):
        unpack_frame(b"")
    with pytest.raises(ValueError, match="version"):
        unpack_frame(b"\x02" + good[1:])


@pytest.mark.parametrize(
    "header",
    [
        TaggedHeader(2**16, 0, 0, 0),
        TaggedHeader(0, -1, 0, 0),
        TaggedHeader(0, 0, 2**32, 0),
        TaggedHeader(0, 0, 0, 2**64),
    ],
)
def test_pack_rejects_out_of_range_fields(header: TaggedHeader) -> None:
    with pytest.raises(ValueError, match="out of range"):
        pack_header(header)
