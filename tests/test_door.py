"""The door on a real server: a conversation admitted at its first committed
text is never refused while it lives, however many new sessions knock; a new
session beyond the door waits and is then served, or hears ``busy`` before
any of its audio; ``/readyz/conversations`` says when the door is closed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from tests.conftest import RunningServer
from tests.helpers import Transcript, open_ws, recv_until, send

STREAM = {"response_format": "pcm", "stream_audio": True, "frame_ms": 20}
REPLY = "Sure, here is what I found. The first option is cheaper, and the second one is faster."


async def _speak_paced(ws: object, text: str, cid: str | None = None) -> None:
    """Send ``text`` word by word, as an LLM would, then ``input.done``."""
    extra = {} if cid is None else {"context_id": cid}
    for word in text.split(" "):
        await send(ws, type="input.text", text=word + " ", **extra)  # type: ignore[arg-type]
        await asyncio.sleep(0.03)
    await send(ws, type="input.done", **extra)  # type: ignore[arg-type]


async def _knock(url: str) -> Transcript:
    """A new session that says one thing and reports what it heard."""
    async with await open_ws(url) as ws:
        await ws.recv()
        await send(ws, type="session.config", **STREAM)
        await ws.recv()
        await send(ws, type="input.text", text="Let me in, please.")
        await send(ws, type="input.done")
        return await recv_until(ws, Transcript(), limit_s=60)


async def _get(server: RunningServer, path: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(server.http + path)


async def _door(server: RunningServer) -> httpx.Response:
    return await _get(server, "/readyz/conversations")


async def test_an_admitted_conversation_is_never_refused_beside_a_flood(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(max_active_streams=2, admission_deadline_s=0.5)
    assert (await _door(server)).json()["status"] == "ready"
    async with await open_ws(server.ws_url) as agent:
        await agent.recv()
        await send(agent, type="session.config", framing="tagged", **STREAM)
        await agent.recv()
        await _speak_paced(agent, REPLY)
        heard = await recv_until(agent, Transcript(), limit_s=60)
        assert server.state.admission.active == 1
        # twelve new sessions knock while the agent goes on speaking, reply
        # after reply, on two contexts: the door lets one more in
        flood = [asyncio.create_task(_knock(server.ws_url)) for _ in range(12)]
        for i in range(4):
            cid = "ab"[i % 2]
            await _speak_paced(agent, f"Reply {i}. " + REPLY, cid)
            heard = await recv_until(agent, heard, limit_s=60)
        knocked = await asyncio.gather(*flood)
        assert not heard.of("error"), heard.of("error")
        done = heard.of("session.done")
        assert len(done) == 5 and not any(d["cancelled"] for d in done)
        assert server.state.admission.active == 1  # the agent is still admitted
    served = refused = 0
    for t in knocked:
        errors = t.of("error")
        if errors:
            (error,) = errors
            assert error["code"] == "busy" and not error["fatal"]
            assert error["retry_after_ms"] and error["waited_ms"] is not None
            assert error["waited_ms"] <= 500 + 100  # answered within the deadline
            # refused before any audio: nothing of it was ever spoken
            assert not t.binary and not t.of("audio.start")
            assert t.of("session.done")[0]["cancelled"]
            refused += 1
        else:
            assert t.binary and not t.of("session.done")[0]["cancelled"]
            served += 1
    assert refused >= 1 and served >= 1 and served + refused == 12


async def test_a_full_door_says_so_until_a_conversation_ends(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(max_active_streams=1, admission_deadline_s=30)
    async with await open_ws(server.ws_url) as a:
        await a.recv()
        await send(a, type="session.config", **STREAM)
        await a.recv()
        await send(a, type="input.text", text="I am admitted.")
        await send(a, type="input.done")
        await recv_until(a, Transcript(), limit_s=60)
        # the reply is spoken, the conversation goes on: the door stays closed
        full = await _door(server)
        assert full.status_code == 503
        assert full.json() == {"status": "full", "admitted": 1, "limit": 1, "waiting": 0}
        assert (await _get(server, "/readyz")).status_code == 200
        waiting = asyncio.create_task(_knock(server.ws_url))
        async with asyncio.timeout(20):
            while server.state.admission.depth != 1:
                await asyncio.sleep(0.01)
        assert (await _door(server)).json()["waiting"] == 1
        await send(a, type="input.text", text="Still mine.")
        await send(a, type="input.done")
        t = await recv_until(a, Transcript(), limit_s=60)
        assert not t.of("error")
    # the first conversation ended: the waiting one is let in and served
    t = await waiting
    assert not t.of("error") and t.binary
    done = t.of("session.done")[0]
    assert not done["cancelled"] and done["metrics"]["admission_wait_ms"] > 0
    async with asyncio.timeout(10):
        while server.state.admission.active:
            await asyncio.sleep(0.02)
    assert (await _door(server)).status_code == 200
    metrics = (await _get(server, "/metrics")).text
    assert 'gateway_admission_refused_total{reason="deadline",surface="ws"}' not in metrics
    assert (await _door(server)).json()["admitted"] == 0
