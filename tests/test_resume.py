"""``session.resume`` (protocol 2.1.0) on a real server: a connection cut
abruptly (the client aborts its TCP transport) suspends the session, and a
new connection takes it back with the audio continuing where the client's
stopped: sequence numbers continue, no sample is repeated or skipped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gateway.audio.framing import unpack_frame
from tests.conftest import RunningServer
from tests.helpers import Transcript, open_ws, recv_until, send

TEXT = (
    "The old lighthouse stood at the edge of the cliff for a hundred years. "
    "Every night its lamp turned slowly over the dark water."
)
#: tagged frames paced in real time: the drop lands mid-utterance
TAGGED = {
    "response_format": "pcm",
    "stream_audio": True,
    "frame_ms": 20,
    "framing": "tagged",
    "flow_control": "realtime",
    "max_lead_ms": 200,
}


async def _open(server: RunningServer, **kwargs: Any) -> tuple[ClientConnection, dict[str, Any]]:
    ws = await open_ws(server.ws_url, **kwargs)
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created"
    return ws, created


async def _configured(server: RunningServer) -> tuple[ClientConnection, dict[str, Any]]:
    ws, created = await _open(server)
    await send(ws, type="session.config", **TAGGED)
    assert json.loads(await ws.recv())["type"] == "session.updated"
    return ws, created


def _drop(ws: ClientConnection) -> None:
    """Cut the TCP connection: no close frame, no session.close."""
    ws.transport.abort()


async def _resume(
    server: RunningServer, token: str, received: int, events: int | None = None, **kwargs: Any
) -> tuple[ClientConnection, dict[str, Any]]:
    ws, _ = await _open(server, **kwargs)
    await send(
        ws,
        type="session.resume",
        resume_token=token,
        received=[{"context_id": None, "messages": received}],
        events=events,
    )
    return ws, json.loads(await ws.recv())


async def _refused(ws: ClientConnection) -> tuple[str, int]:
    """The refusal's error code and the close code that follows."""
    error = json.loads(await ws.recv())
    assert error["type"] == "error" and error["fatal"] is True
    with pytest.raises(ConnectionClosed) as closed:
        await ws.recv()
    assert closed.value.rcvd is not None
    return error["code"], closed.value.rcvd.code


def _samples(frame: bytes) -> int:
    return len(unpack_frame(frame)[1]) // 2


def _check_continuous(frames: list[bytes], done: list[dict[str, Any]]) -> None:
    """Sequence numbers from 0 without a gap; each frame's sample offset is
    where the one before it ended; the samples are what audio.done reports."""
    headers = [unpack_frame(f)[0] for f in frames]
    assert [h.sequence for h in headers] == list(range(len(frames)))
    by_utterance: dict[int, int] = {}
    for header, frame in zip(headers, frames, strict=True):
        expected = by_utterance.get(header.utterance_index, 0)
        assert header.sample_offset == expected, (header, expected)
        by_utterance[header.utterance_index] = expected + _samples(frame)
    assert sum(_samples(f) * 2 for f in frames) == sum(d["total_bytes"] for d in done)


async def test_resume_mid_utterance_continues_the_audio(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=30)
    ws, created = await _configured(server)
    await send(ws, type="input.text", text=TEXT)
    await send(ws, type="input.done")
    before = Transcript()
    async with asyncio.timeout(30):
        while len(before.binary) < 12:
            raw = await ws.recv()
            before.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
    _drop(ws)
    assert not before.of("session.done")

    async with asyncio.timeout(60):
        ws2, again = await _resume(server, created["resume_token"], len(before.binary))
        assert again["type"] == "session.created"
        assert again["session_id"] == created["session_id"]
        assert again["resume_token"] not in (None, created["resume_token"])
        assert again["defaults"]["framing"] == "tagged"
        resumed = json.loads(await ws2.recv())
        assert resumed["type"] == "session.resumed"
        assert resumed["contexts"] == [{"context_id": None, "text_chars": 0, "next_sequence": 12}]
        after = await recv_until(ws2, Transcript())
        await ws2.close()
    # events after the last frame received may come again: counted once
    done = {
        (d["utterance_index"], d["sentence_index"]): d
        for t in (before, after)
        for d in t.of("audio.done")
    }
    _check_continuous(before.binary + after.binary, list(done.values()))
    assert len(after.of("session.done")) == 1
    assert after.of("session.done")[0]["cancelled"] is False


async def test_resume_between_utterances_keeps_the_pending_text(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=30)
    ws, created = await _configured(server)
    await send(ws, type="input.text", text="Hello there.")
    await send(ws, type="input.done")
    first = await recv_until(ws, Transcript())
    await send(ws, type="input.text", text="It was a bright cold day ")
    await asyncio.sleep(0.2)
    _drop(ws)

    async with asyncio.timeout(60):
        # session.updated, then the first utterance's events
        events = 1 + len(first.events)
        ws2, again = await _resume(server, created["resume_token"], len(first.binary), events)
        assert again["type"] == "session.created"
        resumed = json.loads(await ws2.recv())
        assert resumed["contexts"] == [
            {
                "context_id": None,
                "text_chars": len("It was a bright cold day "),
                "next_sequence": len(first.binary),
            }
        ]
        await send(ws2, type="input.text", text="in April.")
        await send(ws2, type="input.done")
        second = await recv_until(ws2, Transcript())
        await ws2.close()
    spoken = " ".join(s["sentence_text"] for s in second.of("audio.start"))
    assert spoken.split() == ["It", "was", "a", "bright", "cold", "day", "in", "April."]
    _check_continuous(
        first.binary + second.binary, first.of("audio.done") + second.of("audio.done")
    )


async def test_resume_past_the_window_is_expired(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=0.3)
    ws, created = await _configured(server)
    await send(ws, type="input.text", text="Hello there.")
    _drop(ws)
    await asyncio.sleep(1.0)
    async with asyncio.timeout(30):
        ws2, error = await _resume(server, created["resume_token"], 0)
        assert error["type"] == "error" and error["code"] == "resume_expired"
        assert error["fatal"] is True
        with pytest.raises(ConnectionClosed):
            await ws2.recv()
    assert server.state.sessions == 0  # the suspended session ended with its window


async def test_a_bad_token_is_refused(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(resume_window_s=30)
    async with asyncio.timeout(30):
        ws, error = await _resume(server, "not-a-token", 0)
        assert (error["code"], error["fatal"]) == ("resume_invalid", True)
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_a_used_token_is_refused(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(resume_window_s=30)
    ws, created = await _configured(server)
    _drop(ws)
    async with asyncio.timeout(30):
        ws2, again = await _resume(server, created["resume_token"], 0)
        assert again["type"] == "session.created"
        assert json.loads(await ws2.recv())["type"] == "session.resumed"
        ws3, error = await _resume(server, created["resume_token"], 0)
        assert error["code"] == "resume_invalid"
        # the resumed session is untouched: it still speaks
        await send(ws2, type="input.text", text="Hello there.")
        await send(ws2, type="input.done")
        t = await recv_until(ws2, Transcript())
        assert t.binary and t.of("session.done")[0]["cancelled"] is False
        await ws2.close()
        await ws3.close()


async def test_a_token_of_another_key_is_refused(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=30, api_keys=["key-one", "key-two"])
    ws, created = await _open(server, additional_headers={"Authorization": "Bearer key-one"})
    _drop(ws)
    async with asyncio.timeout(30):
        other = {"additional_headers": {"Authorization": "Bearer key-two"}}
        ws2, error = await _resume(server, created["resume_token"], 0, **other)
        assert error["code"] == "resume_forbidden"
        await ws2.close()
        mine = {"additional_headers": {"Authorization": "Bearer key-one"}}
        ws3, again = await _resume(server, created["resume_token"], 0, **mine)
        assert again["type"] == "session.created"  # the wrong key did not use it up
        await ws3.close()


async def test_session_close_does_not_suspend(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=30)
    ws, created = await _configured(server)
    await send(ws, type="session.close")
    with pytest.raises(ConnectionClosed):
        await ws.recv()
    async with asyncio.timeout(30):
        ws2, error = await _resume(server, created["resume_token"], 0)
        assert error["code"] == "resume_invalid"
        await ws2.close()


async def test_a_suspended_session_counts_and_can_still_be_resumed_at_the_limit(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=30, max_sessions=1)
    ws, created = await _configured(server)
    _drop(ws)
    async with asyncio.timeout(30):
        while server.state.resumes.suspended == 0:  # the server runs in its own thread
            await asyncio.sleep(0.01)
        assert server.state.sessions == 1  # the suspended session still counts
        # a new conversation is refused at the limit (after its first message)
        new, _ = await _open(server)
        await send(new, type="input.text", text="Hello there.")
        assert await _refused(new) == ("busy", 1013)
        # the suspended session's resume is let in
        ws2, again = await _resume(server, created["resume_token"], 0)
        assert again["type"] == "session.created"
        assert json.loads(await ws2.recv())["type"] == "session.resumed"
        # and with no session suspended, a new connection is refused at once
        ws3 = await open_ws(server.ws_url)
        assert await _refused(ws3) == ("busy", 1013)
        await ws2.close()


async def test_resume_with_two_contexts_continues_each(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=30)
    ws, created = await _configured(server)
    for cid in ("a", "b"):
        await send(ws, type="input.text", text=TEXT, context_id=cid)
        await send(ws, type="input.done", context_id=cid)
    before = Transcript()
    async with asyncio.timeout(30):
        while len(before.binary) < 16:
            raw = await ws.recv()
            before.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
    _drop(ws)
    numbers = {s["context_number"]: s["context_id"] for s in before.of("audio.start")}
    counts = {cid: 0 for cid in ("a", "b")}
    for frame in before.binary:
        counts[numbers[unpack_frame(frame)[0].context]] += 1
    async with asyncio.timeout(60):
        ws2, _ = await _open(server)
        await send(
            ws2,
            type="session.resume",
            resume_token=created["resume_token"],
            received=[{"context_id": c, "messages": n} for c, n in counts.items()],
            events=len(before.events) + 1,  # and the session.updated before them
        )
        assert json.loads(await ws2.recv())["type"] == "session.created"
        resumed = json.loads(await ws2.recv())
        assert {c["context_id"]: c["next_sequence"] for c in resumed["contexts"]} == counts
        after = await recv_until(ws2, Transcript(), count=2)
        await ws2.close()
    every = before.items + after.items
    for cid in ("a", "b"):
        starts = [e for e in every if isinstance(e, dict) and e["type"] == "audio.start"]
        number = next(s["context_number"] for s in starts if s["context_id"] == cid)
        frames = [f for f in before.binary + after.binary if unpack_frame(f)[0].context == number]
        done = [
            e
            for e in every
            if isinstance(e, dict) and e["type"] == "audio.done" and e["context_id"] == cid
        ]
        assert len({(d["utterance_index"], d["sentence_index"]) for d in done}) == len(done)
        _check_continuous(frames, done)
    assert sorted(d["context_id"] for d in after.of("session.done")) == ["a", "b"]


async def test_a_suspended_session_holds_its_sends_and_loses_nothing(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Without flow control the server sends as fast as it decodes; once the
    connection is gone nothing more is sent (the held log stops growing: the
    sends wait, so decoding stops at the session buffer), and the resume
    delivers every sample."""
    server = server_factory(resume_window_s=30)
    ws, created = await _open(server)
    config = {**TAGGED, "flow_control": "none"}
    del config["max_lead_ms"]
    await send(ws, type="session.config", **config)
    assert json.loads(await ws.recv())["type"] == "session.updated"
    await send(ws, type="input.text", text=TEXT * 3)
    await send(ws, type="input.done")
    before = Transcript()
    async with asyncio.timeout(30):
        while not before.binary:
            raw = await ws.recv()
            before.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
    _drop(ws)
    async with asyncio.timeout(30):
        while server.state.resumes.suspended == 0:  # the server runs in its own thread
            await asyncio.sleep(0.01)
        (holder,) = server.state.resumes.suspended_holders()
        log = holder.out.log
        await asyncio.sleep(0.5)
        held = log.sent
        await asyncio.sleep(1.0)
        assert log.sent == held  # nothing sent while suspended
        ws2, again = await _resume(
            server, created["resume_token"], len(before.binary), len(before.events)
        )
        assert again["type"] == "session.created"
        resumed = json.loads(await ws2.recv())
        assert resumed["type"] == "session.resumed"
        after = await recv_until(ws2, Transcript())
        await ws2.close()
    # the utterance was paused, not finished: live audio followed the replay
    assert len(after.binary) > resumed["replayed_messages"]
    _check_continuous(
        before.binary + after.binary, before.of("audio.done") + after.of("audio.done")
    )


@pytest.mark.parametrize("code", [1000, 1001])
async def test_a_client_that_closes_its_socket_ends_its_session_at_once(
    server_factory: Callable[..., RunningServer], code: int
) -> None:
    """A close frame is an end, not a drop: the plugins stop by closing their
    socket (docs/integrations.md) and a browser tab that leaves says 1001; the
    session's work stops at once and it no longer counts or holds the door."""
    server = server_factory(resume_window_s=30)
    ws, created = await _configured(server)
    await send(ws, type="input.text", text=TEXT)
    await send(ws, type="input.done")
    async with asyncio.timeout(30):
        while not isinstance(await ws.recv(), bytes):
            pass
        await ws.close(code)
        while server.state.sessions:  # the server runs in its own thread
            await asyncio.sleep(0.01)
        assert server.state.resumes.suspended == 0
        ws2, error = await _resume(server, created["resume_token"], 0)
        assert error["code"] == "resume_invalid"
        await ws2.close()
