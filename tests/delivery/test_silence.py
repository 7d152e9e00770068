"""Silence the gateway makes: SSML pauses and the job of a segment with
nothing to speak (gateway.delivery.silence)."""

from __future__ import annotations

import asyncio

from gateway.delivery.silence import SilentJob, pause_ms, pause_samples
from gateway.text.frontend import SpokenSegment


def test_pauses_before_and_after_the_speech() -> None:
    seg = SpokenSegment("a", "Hello there.", (), pauses=((0, 200), (5, 300), (12, 100)))
    assert pause_ms(seg) == (200, 400)
    only = SpokenSegment('<break time="1s"/>', "", (), pauses=((0, 1000),))
    assert pause_ms(only) == (1000, 0)
    assert pause_ms(None) == (0, 0)
    assert pause_samples(250, 16000).shape == (4000,)
    assert not pause_samples(250, 16000).any()


def test_silent_job_has_no_events() -> None:
    async def events() -> list[object]:
        return [e async for e in SilentJob()]

    assert asyncio.run(events()) == []
