"""``gateway.client`` resumes by itself (``auto_resume``, protocol 2.1.0):
a real server behind the fault proxy (``tests/faultproxy.py``), whose
connections are dropped mid-reply (``refuse``: every connection closed
without a close frame, new ones refused until ``resume``).  The caller's
``events()`` goes on without a ``Disconnected``: sequence numbers continue,
the samples are what ``audio.done`` reports, the text is spoken once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gateway.client import AudioFrame, Client, Disconnected, Event, State
from gateway.protocol import AudioCancelled, AudioDone, AudioStart, SessionConfig, SessionDone
from tests.conftest import RunningServer
from tests.faultproxy import FaultProxy

TEXT = (
    "The old lighthouse stood at the edge of the cliff for a hundred years. "
    "Every night its lamp turned slowly over the dark water."
)
#: tagged frames paced in real time: a drop lands mid-utterance
TAGGED = SessionConfig(
    response_format="pcm",
    stream_audio=True,
    frame_ms=20,
    framing="tagged",
    flow_control="realtime",
    max_lead_ms=200,
)
#: a guard against a hung test, never an assertion about speed
HANG_GUARD_S = 60


@contextmanager
def proxied(server: RunningServer) -> Iterator[tuple[FaultProxy, str]]:
    proxy = FaultProxy(int(server.http.rsplit(":", 1)[1]))
    try:
        yield proxy, f"ws://127.0.0.1:{proxy.port}/v1/audio/speech/stream"
    finally:
        proxy.close()


async def until(client: Client, done: Callable[[list[Event]], bool]) -> list[Event]:
    events: list[Event] = []
    async with asyncio.timeout(HANG_GUARD_S):
        while not done(events):
            events.append(await client.next_event())
    return events


async def drop(client: Client, proxy: FaultProxy) -> None:
    """The network goes down (every connection closed, no close frame) and
    comes back once the client is trying to resume."""
    await asyncio.to_thread(proxy.refuse)
    async with asyncio.timeout(HANG_GUARD_S):
        while client.state is not State.RESUMING:
            await asyncio.sleep(0.01)
    await asyncio.to_thread(proxy.resume)


def frames_of(events: list[Event], context_id: str | None = None) -> list[AudioFrame]:
    return [e for e in events if isinstance(e, AudioFrame) and e.context_id == context_id]


def check_continuous(events: list[Event], context_id: str | None = None) -> None:
    """Sequence numbers from 0 without a gap or repeat, each frame starting
    where the one before it ended, the samples what audio.done reports."""
    frames = frames_of(events, context_id)
    headers = [f.header for f in frames if f.header is not None]
    assert len(headers) == len(frames) > 0
    assert [h.sequence for h in headers] == list(range(len(frames)))
    ends: dict[int, int] = {}
    for header, frame in zip(headers, frames, strict=True):
        assert header.sample_offset == ends.get(header.utterance_index, 0)
        ends[header.utterance_index] = header.sample_offset + len(frame.data) // 2
    done = [e for e in events if isinstance(e, AudioDone) and e.context_id == context_id]
    # exactly once each: the client counts the events it got, so none repeats
    assert len({(d.utterance_index, d.sentence_index) for d in done}) == len(done)
    assert sum(len(f.data) for f in frames) == sum(d.total_bytes for d in done)


def spoken(events: list[Event], context_id: str | None = None) -> list[str]:
    return " ".join(
        e.sentence_text for e in events if isinstance(e, AudioStart) and e.context_id == context_id
    ).split()


async def test_a_drop_mid_reply_is_resumed_without_a_gap(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=30)
    with proxied(server) as (proxy, url):
        client = await Client.connect(url, TAGGED)
        async with client:
            first = client.session
            assert first is not None and first.resume_token
            await client.send_text(TEXT)
            await client.done()
            events = await until(client, lambda e: len(frames_of(e)) >= 10)
            await drop(client, proxy)
            events += await until(client, lambda e: any(isinstance(x, SessionDone) for x in e))
            assert len(proxy.connections) == 2 and client.resumes == 1
            assert client.session is not None
            assert client.session.session_id == first.session_id
            assert client.session.resume_token not in (None, first.resume_token)
    assert not any(isinstance(e, Disconnected) for e in events)
    # the drop landed mid-reply: some audio came on the resumed connection
    assert client.last_resumed is not None and client.last_resumed.contexts
    check_continuous(events)
    assert spoken(events) == TEXT.split()
    (finished,) = [e for e in events if isinstance(e, SessionDone)]
    assert not finished.cancelled


async def test_text_given_while_disconnected_is_sent_after_the_resume_once(
    server_factory: Callable[..., RunningServer],
) -> None:
    """The open utterance's text the server holds is not sent again
    (``text_chars``); what was given during the drop is, in order."""
    server = server_factory(resume_window_s=30)
    with proxied(server) as (proxy, url):
        client = await Client.connect(url, TAGGED)
        async with client:
            await client.send_text("Hello there.")
            await client.done()
            events = await until(client, lambda e: any(isinstance(x, SessionDone) for x in e))
            await client.send_text("It was a bright cold day ", context_id="b")
            await client.send_text("The clocks were ", context_id="c")
            await asyncio.sleep(0.2)  # the server reads them before the drop
            await asyncio.to_thread(proxy.refuse)
            async with asyncio.timeout(HANG_GUARD_S):
                while client.state is not State.RESUMING:
                    await asyncio.sleep(0.01)
            # given while no connection is up: held, not an error
            await client.send_text("in April.", context_id="b")
            await client.done("b")
            await client.send_text("striking thirteen.", context_id="c")
            await client.done("c")
            await asyncio.to_thread(proxy.resume)
            events += await until(client, lambda e: sum(isinstance(x, SessionDone) for x in e) == 2)
            assert client.resumes == 1
            held = {c.context_id: c.text_chars for c in client.last_resumed.contexts}  # type: ignore[union-attr]
            assert (held["b"], held["c"]) == (
                len("It was a bright cold day "),
                len("The clocks were "),
            )
    assert not any(isinstance(e, Disconnected) for e in events)
    assert spoken(events, "b") == ["It", "was", "a", "bright", "cold", "day", "in", "April."]
    assert spoken(events, "c") == ["The", "clocks", "were", "striking", "thirteen."]
    for context_id in (None, "b", "c"):
        check_continuous(events, context_id)


async def test_a_cancel_given_while_disconnected_goes_out_after_the_resume(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=30)
    with proxied(server) as (proxy, url):
        client = await Client.connect(url, TAGGED)
        async with client:
            await client.send_text(TEXT)
            await client.done()
            events = await until(client, lambda e: len(frames_of(e)) >= 5)
            await asyncio.to_thread(proxy.refuse)
            async with asyncio.timeout(HANG_GUARD_S):
                while client.state is not State.RESUMING:
                    await asyncio.sleep(0.01)
            cancelling = asyncio.create_task(client.cancel())  # waits for the resume
            await asyncio.to_thread(proxy.resume)
            events += await until(client, lambda e: any(isinstance(x, SessionDone) for x in e))
            await cancelling
            assert client.resumes == 1
    assert not any(isinstance(e, Disconnected) for e in events)
    (finished,) = [e for e in events if isinstance(e, SessionDone)]
    assert finished.cancelled  # the reply stopped: the cancel reached the resumed session
    assert any(isinstance(e, AudioCancelled) for e in events)


async def test_past_the_window_the_drop_is_reported_as_before(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=1.0)
    with proxied(server) as (proxy, url):
        client = await Client.connect(url, TAGGED)
        async with client:
            await client.send_text("This text is in flight ")
            await asyncio.to_thread(proxy.refuse)  # down for longer than the window
            (end,) = [e for e in await until(client, _disconnected) if _disconnected([e])]
            assert isinstance(end, Disconnected)
            assert end.code == 1006 and "resume_window_s" in end.reason
            assert [f.text for f in end.failed] == ["This text is in flight "]
            assert client.state is State.CLOSED and client.resumes == 0
            await asyncio.to_thread(proxy.resume)
            first = client.session
            await client.reconnect()  # today's path: a new session, nothing re-sent
            assert client.session is not None and first is not None
            assert client.session.session_id != first.session_id


async def test_a_refused_resume_is_reported_as_before(
    server_factory: Callable[..., RunningServer],
) -> None:
    """The server no longer holds the session (``resume_invalid``, as after a
    restart): no more tries, ``Disconnected`` with the text in flight."""
    server = server_factory(resume_window_s=30)
    with proxied(server) as (proxy, url):
        client = await Client.connect(url, TAGGED)
        async with client:
            await client.send_text("This text is in flight ")
            client._tracker.token = "a-token-no-session-holds"
            await asyncio.to_thread(proxy.refuse)
            await asyncio.to_thread(proxy.resume)
            events = await until(client, _disconnected)
            end = events[-1]
            assert isinstance(end, Disconnected)
            assert "resume_invalid" in end.reason
            assert [f.text for f in end.failed] == ["This text is in flight "]


async def test_a_server_without_resume_is_reported_as_before(
    piper_server: RunningServer,
) -> None:
    """``resume_window_s`` 0 (no ``resume_token``): the drop ends the
    connection at once, as before protocol 2.1.0."""
    with proxied(piper_server) as (proxy, url):
        client = await Client.connect(url, TAGGED)
        async with client:
            assert client.session is not None and client.session.resume_token is None
            await client.send_text("This text is in flight ")
            await asyncio.to_thread(proxy.refuse)
            end = (await until(client, _disconnected))[-1]
            assert isinstance(end, Disconnected) and end.code == 1006
            assert [f.text for f in end.failed] == ["This text is in flight "]
            assert len(proxy.connections) == 1  # no try to resume


def _disconnected(events: list[Event]) -> bool:
    return any(isinstance(e, Disconnected) for e in events)
