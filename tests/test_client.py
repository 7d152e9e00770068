"""``gateway.client`` against a real gateway on loopback (shared Piper engine)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import msgspec
import pytest
from websockets.asyncio.server import ServerConnection, serve

from gateway.client import (
    LOW_LATENCY,
    AudioFrame,
    Client,
    ClientError,
    Disconnected,
    Event,
    frame_ms,
    resume_url,
)
from gateway.protocol import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    SessionConfig,
    SessionDone,
    encode_text,
)
from tests.conftest import RunningServer
from tests.helpers import open_ws

PARAGRAPH = (
    "The library opens at eight in the morning on weekdays and at ten on Saturdays."
    " It is closed on Sundays, but the returns box outside is always open."
)


async def collect(
    client: Client, done: int = 1, limit_s: float = 60.0
) -> tuple[list[Event], list[SessionDone]]:
    events: list[Event] = []
    finished: list[SessionDone] = []
    async with asyncio.timeout(limit_s):
        while len(finished) < done:
            event = await client.next_event()
            events.append(event)
            if isinstance(event, SessionDone):
                finished.append(event)
            assert not isinstance(event, Disconnected), event
    return events, finished


async def test_low_latency_config_by_default_and_speak(piper_server: RunningServer) -> None:
    async with await Client.connect(piper_server.ws_url) as client:
        assert client.config is not None
        assert client.config.response_format == "pcm" and client.config.stream_audio
        assert client.config.frame_ms == 20
        voice = client.session.voices[0] if client.session else None
        assert voice is not None and client.config.sample_rate == voice.sample_rate
        audio, done = await client.speak("Hello there.")
        assert done.metrics is not None and done.metrics.audio_ms > 300
        seconds = len(audio) / 2 / client.config.sample_rate
        assert seconds * 1000 == pytest.approx(done.metrics.audio_ms, abs=1)


async def test_tagged_contexts_route_every_frame(piper_server: RunningServer) -> None:
    config = msgspec.structs.replace(LOW_LATENCY, framing="tagged")
    async with await Client.connect(piper_server.ws_url, config) as client:
        await client.send_text("First context speaks. ", context_id="a")
        await client.send_text("Second context speaks too. ", context_id="b")
        await client.done("a")
        await client.done("b")
        events, finished = await collect(client, done=2)
    assert {d.context_id for d in finished} == {"a", "b"}
    frames = [e for e in events if isinstance(e, AudioFrame)]
    starts = {e.context_number: e.context_id for e in events if isinstance(e, AudioStart)}
    assert {f.context_id for f in frames} == {"a", "b"}
    for f in frames:
        assert f.header is not None and starts[f.header.context] == f.context_id
    for ctx in ("a", "b"):
        sequences = [f.header.sequence for f in frames if f.context_id == ctx and f.header]
        assert sequences == list(range(len(sequences)))


async def test_cancel_reports_and_ends_the_utterance(piper_server: RunningServer) -> None:
    async with await Client.connect(piper_server.ws_url) as client:
        await client.send_text(PARAGRAPH)
        await client.done()
        cancelled: AudioCancelled | None = None
        after_report = 0
        async with asyncio.timeout(60):
            while True:
                event = await client.next_event()
                if isinstance(event, AudioFrame) and cancelled is None:
                    await client.cancel()
                elif isinstance(event, AudioFrame):
                    after_report += 1
                elif isinstance(event, AudioCancelled):
                    cancelled = event
                elif isinstance(event, SessionDone):
                    break
        assert cancelled is not None and event.cancelled
        assert after_report == 0  # nothing of the cancelled audio follows the report
        assert cancelled.unspoken_text


async def test_playback_reports_release_an_ack_window(piper_server: RunningServer) -> None:
    config = msgspec.structs.replace(LOW_LATENCY, flow_control="ack", max_lead_ms=200)
    async with await Client.connect(piper_server.ws_url, config) as client:
        await client.send_text(PARAGRAPH)
        await client.done()
        received = 0.0
        with_reports = False
        async with asyncio.timeout(60):
            while True:
                try:
                    event = await client.next_event(timeout_s=1.0)
                except TimeoutError:
                    if not with_reports:  # the window is full: max_lead_ms without reports
                        assert 0 < received <= 200 + 20
                    with_reports = True
                    await client.playback(received)
                    continue
                if isinstance(event, AudioFrame):
                    received += frame_ms(event)
                    if with_reports:
                        await client.playback(received)
                elif isinstance(event, SessionDone):
                    break
        assert with_reports and event.metrics is not None
        assert received == pytest.approx(event.metrics.audio_ms, abs=1)


async def test_a_consumer_that_stops_bounds_the_client_buffer(
    piper_server: RunningServer,
) -> None:
    client = await Client.connect(piper_server.ws_url, max_queued=8)
    async with client:
        await client.send_text(PARAGRAPH + " " + PARAGRAPH)
        await client.done()
        await asyncio.sleep(3.0)  # not iterating: the reader stops at the bound
        assert client.queued == 8
        _, finished = await collect(client)  # resuming gets everything, in order
        assert finished[0].metrics is not None and finished[0].metrics.audio_ms > 5000


async def test_reconnect_reports_text_in_flight_and_never_resends(
    piper_server: RunningServer,
) -> None:
    client = await Client.connect(piper_server.ws_url)
    async with client:
        first_session = client.session.session_id if client.session else ""
        await client.send_text("This text is in flight ")
        assert client._ws is not None
        client._ws.transport.abort()  # the network drops
        async with asyncio.timeout(10):
            while not isinstance(event := await client.next_event(), Disconnected):
                pass
        assert [f.text for f in event.failed] == ["This text is in flight "]
        failed = await client.reconnect()
        assert [f.text for f in failed] == ["This text is in flight "]
        assert client.session is not None and client.session.session_id != first_session
        # the new session starts empty: input.done alone is an empty utterance
        await client.done()
        _, finished = await collect(client)
        assert finished[0].total_sentences == 0


async def test_config_rejection_raises(piper_server: RunningServer) -> None:
    async with await Client.connect(piper_server.ws_url) as client:
        with pytest.raises(ClientError, match="unknown_voice"):
            await client.configure(SessionConfig(voice="no-such-voice"))
        assert client.config is not None and client.config.voice == "joe"  # unchanged


async def test_finish_speaks_what_was_flushed_then_the_server_closes(
    piper_server: RunningServer,
) -> None:
    """Protocol 2.0.0: ``finish()`` right after ``done()`` hears the whole
    utterance, then ``Disconnected`` with 1000; only cancel/playback/ping
    may still be sent."""
    async with await Client.connect(piper_server.ws_url) as reference:
        expected, _ = await reference.speak(PARAGRAPH)
    client = await Client.connect(piper_server.ws_url)
    async with client:
        await client.send_text(PARAGRAPH)
        await client.done()
        await client.finish()
        await client.finish()  # once is enough: nothing more is sent
        with pytest.raises(ClientError, match="closing"):
            await client.send_text("too late")
        await client.ping()
        audio = bytearray()
        async with asyncio.timeout(60):
            events = [event async for event in client.events()]
    for event in events:
        if isinstance(event, AudioFrame):
            audio += event.data
    finished = [e for e in events if isinstance(e, SessionDone)]
    assert len(finished) == 1 and not finished[0].cancelled
    assert not any(isinstance(e, AudioCancelled) for e in events)
    last = events[-1]
    assert isinstance(last, Disconnected) and last.code == 1000 and not last.failed
    assert bytes(audio) == expected


async def test_aclose_stops_at_once_with_a_cancel(piper_server: RunningServer) -> None:
    """``aclose()`` is "stop now": ``cancel`` for every context before
    ``session.close`` (which alone would finish the utterance).  A loopback
    server records what the client sends; it answers with the gateway's
    own ``session.created`` and ``session.updated``."""
    async with await open_ws(piper_server.ws_url) as ws:
        created = await ws.recv()
        await ws.send(encode_text(LOW_LATENCY))
        updated = await ws.recv()
    received: list[str] = []

    async def record(conn: ServerConnection) -> None:
        await conn.send(created)
        async for raw in conn:
            message = json.loads(raw)
            received.append(message["type"])
            if message["type"] == "session.config":
                await conn.send(updated)

    async with serve(record, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        client = await Client.connect(f"ws://127.0.0.1:{port}")
        await client.send_text(PARAGRAPH)
        await client.done()
        await client.aclose()
        async with asyncio.timeout(5):
            while received[-1:] != ["session.close"]:
                await asyncio.sleep(0.01)
    assert received == ["session.config", "input.text", "input.done", "cancel", "session.close"]


async def test_resume_after_a_drop_continues_the_audio(
    server_factory: Callable[..., RunningServer],
) -> None:
    """The network drops mid-utterance; ``resume()`` (a client that does not
    resume by itself) takes the session back and
    the frames continue: sequence numbers without a gap, samples as
    audio.done reports them, one session.done."""
    server = server_factory(resume_window_s=30)
    config = SessionConfig(
        response_format="pcm",
        stream_audio=True,
        frame_ms=20,
        framing="tagged",
        flow_control="realtime",
        max_lead_ms=200,
    )
    client = await Client.connect(server.ws_url, config, auto_resume=False)
    async with client:
        await client.send_text(
            "The old lighthouse stood at the edge of the cliff for a hundred years. "
        )
        await client.done()
        frames: list[AudioFrame] = []
        done: list[AudioDone] = []
        async with asyncio.timeout(30):
            while len(frames) < 10:
                event = await client.next_event()
                if isinstance(event, AudioFrame):
                    frames.append(event)
                elif isinstance(event, AudioDone):
                    done.append(event)
        assert client._ws is not None
        client._ws.transport.abort()  # the network drops
        async with asyncio.timeout(30):
            resumed = await client.resume()
            # the frames its reader had queued count too: they are still to come
            assert resumed.contexts[0].next_sequence >= 10
            while True:
                event = await client.next_event()
                if isinstance(event, AudioFrame):
                    frames.append(event)
                elif isinstance(event, AudioDone):
                    done.append(event)
                elif isinstance(event, SessionDone):
                    break
    assert [f.header.sequence for f in frames if f.header] == list(range(len(frames)))
    assert sum(len(f.data) for f in frames) == sum(d.total_bytes for d in done)


def test_resume_url_names_the_tokens_gateway_for_the_proxy() -> None:
    """The resume's URL carries the token's prefix (``?resume=``), never the
    token; a 2.1.0 token (no prefix) leaves the URL as it was."""
    url = "ws://tts.example:8000/v1/audio/speech/stream"
    secret = "Yc3" + "x" * 40
    assert resume_url(url, f"gw-a.{secret}") == url + "?resume=gw-a"
    with_key = resume_url(url + "?api_key=k&resume=old", f"pod-1.{secret}")
    assert with_key == url + "?api_key=k&resume=pod-1"
    assert secret not in with_key
    assert resume_url(url, secret) == url


async def test_a_resume_too_late_tells_the_text_not_heard(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=0.2)
    config = SessionConfig(response_format="pcm", split_granularity="sentence")
    client = await Client.connect(server.ws_url, config)
    async with client:
        await client.send_text("It was a bright cold day")
        async with asyncio.timeout(30):
            while not any(  # the text reached the server
                ctx.utterance is not None
                for conn in server.state.live_sessions
                for ctx in conn.session.contexts
            ):
                await asyncio.sleep(0.01)
            assert client._ws is not None
            client._ws.transport.abort()  # the network drops
            while server.state.sessions:  # the window passes
                await asyncio.sleep(0.01)
            with pytest.raises(ClientError) as refused:
                await client.resume()
    error = refused.value.error
    assert error is not None and error.code == "resume_expired"
    assert error.unspoken is not None
    assert [(u.context_id, u.unspoken_text) for u in error.unspoken] == [
        (None, "It was a bright cold day")
    ]
