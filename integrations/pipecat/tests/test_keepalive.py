"""Keepalive: an agent quiet between turns keeps its gateway session.

The gateway here closes a session after 1.5 s without activity; the quiet
period is 4.5 s, three idle timeouts."""

from __future__ import annotations

import asyncio

from pipecat.frames.frames import ErrorFrame, TTSSpeakFrame, TTSStoppedFrame
from voice_gateway_wire.testing import Gateway

from tests.test_pipeline import pipeline

QUIET_S = 4.5


async def _two_turns_apart(gateway: Gateway, **service_args: object) -> tuple[str, str]:
    async with pipeline(gateway, **service_args) as h:
        first = h.tts.server_info["session_id"]
        await h.send(TTSSpeakFrame("Before the pause."))
        await h.down.wait_for(lambda: len(h.down.of(TTSStoppedFrame)) == 1)
        await asyncio.sleep(QUIET_S)  # the user is thinking
        await h.send(TTSSpeakFrame("After the pause."))
        await h.down.wait_for(lambda: len(h.down.of(TTSStoppedFrame)) == 2)
        assert not h.up.of(ErrorFrame)
        return first, h.tts.server_info["session_id"]


async def test_keepalive_holds_the_session_between_turns(quick_idle_gateway: Gateway) -> None:
    # default interval: half the gateway's idle_timeout_s (0.75 s here)
    before, after = await _two_turns_apart(quick_idle_gateway)
    assert before == after


async def test_without_keepalive_the_gateway_closes_the_quiet_session(
    quick_idle_gateway: Gateway,
) -> None:
    # the counterfactual: pings too rare, the gateway's idle timeout ends
    # the session (error ``timeout``, close 4002) once the turn is over
    async with pipeline(quick_idle_gateway, keepalive_interval_s=3600) as h:
        await h.send(TTSSpeakFrame("Before the pause."))
        await h.down.wait_for(lambda: len(h.down.of(TTSStoppedFrame)) == 1)
        await h.up.wait_for(lambda: any("idle timeout" in e.error for e in h.up.of(ErrorFrame)))
