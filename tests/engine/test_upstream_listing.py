"""Voice listings of the replicas, table-driven: what the front lists as a
replica's voices (speakable) and what it counts as held by the replica
(routing, reconciling uploads).  Shapes: this gateway's ``GET
/v1/audio/voices`` and vllm-omni's documented one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.engines.pool.probe import (
    MAX_LISTING_BYTES,
    held_voices,
    listed_voices,
    parse_listing,
)

GATEWAY = {
    "object": "list",
    "voices": ["tone", "alloy"],
    "data": [
        {"name": "tone", "type": "builtin", "sample_rate": 22050, "language": "en-US"},
        {"name": "alloy", "type": "alias", "target": "tone", "available": True},
        {"name": "Mine", "type": "uploaded", "speakable": False},
    ],
    "uploaded_voices": [{"name": "Mine", "type": "uploaded", "speakable": False}],
}
GATEWAY_CLONING = {
    **GATEWAY,
    "uploaded_voices": [{"name": "Mine", "type": "uploaded", "speakable": True}],
}
VLLM_OMNI = {
    "voices": ["vivian", "ryan"],
    "uploaded_voices": [{"name": "custom_voice_1", "consent": "c", "mime_type": "audio/wav"}],
}


@pytest.mark.parametrize(
    ("doc", "listed", "held"),
    [
        (GATEWAY, ["tone"], {"tone", "mine"}),
        (GATEWAY_CLONING, ["tone", "Mine"], {"tone", "mine"}),
        (VLLM_OMNI, ["vivian", "ryan", "custom_voice_1"], {"vivian", "ryan", "custom_voice_1"}),
        ({"voices": ["a"], "uploaded_voices": [{"name": "A"}]}, ["a"], {"a"}),
        ({"voices": "nope", "uploaded_voices": [3, {"name": 4}]}, [], set()),
        ([], [], set()),
        (None, [], set()),
    ],
)
def test_listed_and_held(doc: Any, listed: list[str], held: set[str]) -> None:
    assert [v["name"] for v in listed_voices(doc)] == listed
    assert held_voices(doc) == held


def test_rich_entries_keep_their_rate() -> None:
    (tone,) = listed_voices(GATEWAY)
    assert tone["sample_rate"] == 22050 and tone["language"] == "en-US"


def test_parse_listing_bounds() -> None:
    assert parse_listing(json.dumps(VLLM_OMNI).encode()) == VLLM_OMNI
    assert parse_listing(b"not json") is None
    assert parse_listing(b" " * (MAX_LISTING_BYTES + 1)) is None
