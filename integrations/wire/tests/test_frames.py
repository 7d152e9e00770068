"""The tagged header against the shared fixture (``tagged_frames.json``), which
``gateway/web/frames.js`` is checked against too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from voice_gateway_wire.frames import (
    HEADER_SIZE,
    FrameFlags,
    TaggedHeader,
    pack_header,
    unpack_frame,
)

FIXTURE: dict[str, Any] = json.loads((Path(__file__).parent / "tagged_frames.json").read_text())


def header_of(case: dict[str, Any]) -> TaggedHeader:
    return TaggedHeader(
        context=case["context"],
        utterance_index=case["utterance_index"],
        sequence=case["sequence"],
        sample_offset=case["sample_offset"],
        flags=FrameFlags(case["flags"]),
        version=case["version"],
    )


def test_the_fixture_and_the_module_agree_on_the_layout() -> None:
    assert FIXTURE["header_bytes"] == HEADER_SIZE
    assert FIXTURE["flags"] == {
        "first": FrameFlags.FIRST,
        "last": FrameFlags.LAST,
        "wav_header": FrameFlags.WAV_HEADER,
    }


@pytest.mark.parametrize("case", FIXTURE["frames"], ids=lambda case: case["name"])
def test_each_frame_packs_and_unpacks(case: dict[str, Any]) -> None:
    data = bytes.fromhex(case["hex"])
    header, payload = unpack_frame(data)
    assert header == header_of(case)
    assert bytes(payload) == bytes.fromhex(case["payload_hex"])
    assert header.is_wav_header == bool(case["flags"] & FIXTURE["flags"]["wav_header"])
    assert pack_header(header) + bytes(payload) == data


@pytest.mark.parametrize("case", FIXTURE["invalid"], ids=lambda case: case["name"])
def test_each_invalid_frame_is_refused(case: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="tagged frame"):
        unpack_frame(bytes.fromhex(case["hex"]))


def test_a_field_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="out of range"):
        pack_header(TaggedHeader(context=65536, utterance_index=0, sequence=0, sample_offset=0))
