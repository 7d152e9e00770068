"""The LiveKit plugin against a real gateway: streaming, synthesize, an
interrupted turn and FallbackAdapter.  What the gateway did is read from its
``/metrics``; no wall-clock thresholds."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from livekit.agents import APIConnectionError, APIConnectOptions, tts
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from voice_gateway_wire.testing import DroppingProxy, Gateway, free_port

from voice_gateway_livekit import TTS

RATE = 24000
LONG_TEXT = " ".join(
    f"This is sentence number {n} of a long answer that the user will interrupt."
    for n in range(1, 9)
)
#: an answer in two halves, the second pushed while the socket is down
ANSWER = " ".join(f"This is sentence number {n} of the answer." for n in range(1, 5))
FIRST_HALF, SECOND_HALF = ANSWER[: len(ANSWER) // 2], ANSWER[len(ANSWER) // 2 :]
HANG_GUARD_S = 90
NO_RETRY = APIConnectOptions(max_retry=0, timeout=10)


def _plugin(gateway: Gateway, http: aiohttp.ClientSession, **kwargs: object) -> TTS:
    return TTS(url=gateway.ws_url, sample_rate=RATE, http_session=http, **kwargs)  # type: ignore[arg-type]


async def test_stream_tokens_flush_and_word_timings(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    plugin = _plugin(gateway, http)
    assert plugin.capabilities.streaming and plugin.capabilities.aligned_transcript
    utterances = gateway.metric("gateway_utterances_total")
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            stream = plugin.stream()
            for token in ["Hello ", "there, ", "how ", "are ", "you ", "today?"]:
                stream.push_text(token)
            stream.flush()
            stream.end_input()
            events = [event async for event in stream]
            await stream.aclose()
        frames = [e.frame for e in events]
        assert frames and all(f.sample_rate == RATE and f.num_channels == 1 for f in frames)
        assert events[-1].is_final
        assert len({e.segment_id for e in events}) == 1
        words = [w for f in frames for w in f.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
        assert "".join(words).split() == ["Hello", "there,", "how", "are", "you", "today?"]
        starts = [w.start_time for w in words]
        assert starts == sorted(starts) and starts[0] >= 0.0
        duration = sum(f.duration for f in frames)
        assert all(w.end_time <= duration + 0.05 for w in words)
        assert gateway.metric("gateway_utterances_total") == utterances + 1
    finally:
        await plugin.aclose()


async def test_synthesize(gateway: Gateway, http: aiohttp.ClientSession) -> None:
    plugin = _plugin(gateway, http)
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            frame = await plugin.synthesize("One whole sentence, said at once.").collect()
        assert frame.sample_rate == RATE and frame.duration > 0.5
    finally:
        await plugin.aclose()


async def test_interrupted_turn_cancels_and_the_next_reuses_the_socket(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    plugin = _plugin(gateway, http)
    cancels = gateway.metric("gateway_cancels_total")
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            stream = plugin.stream(conn_options=NO_RETRY)
            stream.push_text(LONG_TEXT)
            stream.flush()
            first = await stream.__anext__()  # audio is playing
            assert first.frame.duration > 0
            session = plugin.last_session_id
            await stream.aclose()  # the framework's barge-in
            # the gateway reports the cancel (its metric counts it)
            while gateway.metric("gateway_cancels_total") < cancels + 1:
                await asyncio.sleep(0.05)

            second = plugin.stream(conn_options=NO_RETRY)
            second.push_text("A fresh turn.")
            second.end_input()
            audio = [e async for e in second]
            await second.aclose()
        assert audio and audio[-1].is_final
        # the same gateway session: the socket stayed open through the cancel
        assert plugin.last_session_id == session and session
        assert gateway.metric("gateway_cancels_total") == cancels + 1
    finally:
        await plugin.aclose()


async def test_fallback_adapter_falls_back_when_the_gateway_is_down(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    down = TTS(
        url=f"ws://127.0.0.1:{free_port()}/v1/audio/speech/stream",
        sample_rate=RATE,
        http_session=http,
    )
    with pytest.raises(APIConnectionError):
        await down.synthesize("Nobody is listening.", conn_options=NO_RETRY).collect()
    live = _plugin(gateway, http)
    adapter = tts.FallbackAdapter([down, live], max_retry_per_tts=0)
    changes: list[tuple[object, bool]] = []
    adapter.on("tts_availability_changed", lambda ev: changes.append((ev.tts, ev.available)))
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            stream = adapter.stream()
            stream.push_text("Spoken by the second gateway plugin.")
            stream.end_input()
            audio = [e async for e in stream]
            await stream.aclose()
        assert audio and sum(e.frame.duration for e in audio) > 0.5
        assert (down, False) in changes
    finally:
        await adapter.aclose()
        await down.aclose()
        await live.aclose()


async def test_pooled_socket_outlives_the_idle_timeout(
    quick_idle_gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    """WebSocket ping frames (aiohttp's heartbeat) keep a pooled socket's
    session open through 4.5 s of quiet, three of the gateway's 1.5 s idle
    timeouts; the next turn reuses it."""
    plugin = _plugin(quick_idle_gateway, http, heartbeat_s=0.5)
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            await plugin.synthesize("Before the pause.", conn_options=NO_RETRY).collect()
            session = plugin.last_session_id
            await asyncio.sleep(4.5)
            await plugin.synthesize("After the pause.", conn_options=NO_RETRY).collect()
        assert plugin.last_session_id == session and session
    finally:
        await plugin.aclose()


async def test_a_pooled_socket_closed_by_the_gateway_is_replaced(
    quick_idle_gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    """Without pings the gateway closes the idle pooled socket (4002); the
    next turn still speaks, on a new session."""
    plugin = _plugin(quick_idle_gateway, http, heartbeat_s=3600)
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            await plugin.synthesize("Before the pause.").collect()
            session = plugin.last_session_id
            await asyncio.sleep(4.5)
            frame = await plugin.synthesize("After the pause.").collect()
        assert frame.duration > 0.3
        assert plugin.last_session_id != session
    finally:
        await plugin.aclose()


def _words(events: list[tts.SynthesizedAudio]) -> list[str]:
    return "".join(
        w for e in events for w in e.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
    ).split()


async def _turn_with_a_drop(plugin: TTS, proxy: DroppingProxy) -> list[tts.SynthesizedAudio]:
    """One streamed turn whose socket drops after its first audio; the rest
    of its text is pushed while the socket is down."""
    stream = plugin.stream(conn_options=NO_RETRY)
    try:
        stream.push_text(FIRST_HALF)
        events = [await stream.__anext__()]  # audio is playing
        proxy.drop_all()
        stream.push_text(SECOND_HALF)
        stream.flush()
        stream.end_input()
        events += [e async for e in stream]
    finally:
        await stream.aclose()
    return events


async def test_a_drop_mid_turn_is_resumed_and_the_turn_goes_on(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    """The gateway resumes (its default ``resume_window_s``): the turn takes
    the same session back on a new socket, its audio is the whole answer
    with no frame repeated or skipped (as long as the same answer spoken
    without a drop), its words arrive once, and the text was sent once."""
    proxy = DroppingProxy(gateway.port)
    await proxy.start()
    plugin = TTS(url=proxy.ws_url, sample_rate=RATE, http_session=http)
    utterances = gateway.metric("gateway_utterances_total")
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            events = await _turn_with_a_drop(plugin, proxy)
            # the same answer without a drop, sent ahead of real time
            unpaced = _plugin(gateway, http, max_lead_ms=30000)
            reference = unpaced.stream(conn_options=NO_RETRY)
            reference.push_text(ANSWER)
            reference.end_input()
            whole = [e async for e in reference]
            await reference.aclose()
            await unpaced.aclose()
        assert plugin.resumes == 1 and proxy.accepted == 2
        assert events[-1].is_final and len({e.segment_id for e in events}) == 1
        assert _words(events) == ANSWER.split() == _words(whole)
        duration = sum(e.frame.duration for e in events)
        assert duration == pytest.approx(sum(e.frame.duration for e in whole), abs=0.001)
        assert gateway.metric("gateway_utterances_total") == utterances + 2
    finally:
        await plugin.aclose()
        await proxy.aclose()


async def test_a_drop_fails_the_turn_when_the_gateway_does_not_resume(
    no_resume_gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    """``resume_window_s`` 0 (no resume token): the turn fails with
    ``APIConnectionError`` (LiveKit's retries and FallbackAdapter apply), as
    before protocol 2.1.0."""
    proxy = DroppingProxy(no_resume_gateway.port)
    await proxy.start()
    plugin = TTS(url=proxy.ws_url, sample_rate=RATE, http_session=http)
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            with pytest.raises(APIConnectionError):
                await _turn_with_a_drop(plugin, proxy)
        assert plugin.resumes == 0 and proxy.accepted == 1
    finally:
        await plugin.aclose()
        await proxy.aclose()
