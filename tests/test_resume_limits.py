"""Suspended sessions on a real server (protocol 2.2.0): their own limits
(the oldest suspended session ends to make room), their metrics, their
admission kept, resume attempts rate-limited per client, and the text not
heard carried by ``resume_expired`` after the window.

Connections are cut abruptly (the client aborts its TCP transport), as in
``tests/test_resume.py``, whose helpers these tests share.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.conftest import RunningServer
from tests.helpers import Transcript, recv_until, send
from tests.test_resume import TAGGED, TEXT, _configured, _drop, _open, _resume


async def _until(predicate: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Wait for the server (its own thread) to reach a state."""
    async with asyncio.timeout(limit_s):
        while not predicate():
            await asyncio.sleep(0.01)


def _metric(server: RunningServer, name: str, **labels: str) -> float:
    text = httpx.get(server.http + "/metrics", timeout=10).text
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    series = re.escape(f"{name}{{{inner}}}" if labels else name)
    found = re.search(rf"^{series} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def _suspended(server: RunningServer, count: int) -> None:
    await _until(lambda: server.state.resumes.suspended == count)


async def test_at_max_suspended_sessions_the_oldest_suspended_session_ends(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=30, max_suspended_sessions=2)
    opened = [await _configured(server) for _ in range(3)]
    tokens = [created["resume_token"] for _, created in opened]
    for n, (ws, _) in enumerate(opened[:2]):
        _drop(ws)
        await _suspended(server, n + 1)
    assert _metric(server, "gateway_sessions_suspended") == 2
    assert _metric(server, "gateway_suspended_replay_bytes") > 0
    _drop(opened[2][0])  # the third drop: the oldest suspended session ends
    await _until(lambda: server.state.sessions == 2)
    assert server.state.resumes.suspended == 2
    async with asyncio.timeout(30):
        ws, error = await _resume(server, tokens[0], 0)
        assert (error["code"], error["fatal"]) == ("resume_expired", True)
        assert "max_suspended_sessions" in error["message"]
        await ws.close()
        for token in tokens[1:]:  # the newer two are still there
            ws, again = await _resume(server, token, 0)
            assert again["type"] == "session.created"
            assert json.loads(await ws.recv())["type"] == "session.resumed"
            await ws.close()
    assert _metric(server, "gateway_suspended_evicted_total", limit="max_suspended_sessions") == 1
    assert _metric(server, "gateway_resumes_accepted_total") == 2
    assert _metric(server, "gateway_resumes_refused_total", reason="resume_expired") == 1
    await _until(lambda: server.state.sessions == 0)
    assert _metric(server, "gateway_sessions_suspended") == 0
    assert _metric(server, "gateway_suspended_replay_bytes") == 0


async def test_at_the_per_client_limit_that_clients_oldest_suspended_session_ends(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Two agent keys are two clients: one client's drops end only its own
    suspended sessions."""
    server = server_factory(
        resume_window_s=30,
        max_suspended_sessions_per_client=1,
        agent_api_keys=["agent-a", "agent-b"],
    )
    key_a = {"additional_headers": {"Authorization": "Bearer agent-a"}}
    key_b = {"additional_headers": {"Authorization": "Bearer agent-b"}}
    b_ws, b_created = await _open(server, **key_b)
    a1_ws, a1_created = await _open(server, **key_a)
    a2_ws, a2_created = await _open(server, **key_a)
    _drop(b_ws)
    await _suspended(server, 1)
    _drop(a1_ws)
    await _suspended(server, 2)
    _drop(a2_ws)  # agent-a's second: its first ends, agent-b's stays
    await _until(lambda: server.state.sessions == 2)
    async with asyncio.timeout(30):
        ws, error = await _resume(server, a1_created["resume_token"], 0, **key_a)
        assert error["code"] == "resume_expired"
        assert "max_suspended_sessions_per_client" in error["message"]
        await ws.close()
        for created, key in ((b_created, key_b), (a2_created, key_a)):
            ws, again = await _resume(server, created["resume_token"], 0, **key)
            assert again["type"] == "session.created"
            await ws.close()
    limit = "max_suspended_sessions_per_client"
    assert _metric(server, "gateway_suspended_evicted_total", limit=limit) == 1


async def test_the_suspended_replay_bytes_limit_ends_the_oldest_suspended_sessions(
    server_factory: Callable[..., RunningServer],
) -> None:
    """``max_suspended_bytes`` at its least (one session's retention): a
    session whose log is full and a second one with audio of its own cannot
    both be held."""
    server = server_factory(
        resume_window_s=30, resume_retention_bytes=65536, max_suspended_bytes=65536
    )
    sessions = []
    for text in (TEXT, "Hello there."):  # about 8 s of audio, then about 1 s
        ws, created = await _configured(server)
        await send(ws, type="input.text", text=text)
        await send(ws, type="input.done")
        await recv_until(ws, Transcript())
        sessions.append((ws, created))
    _drop(sessions[0][0])
    await _suspended(server, 1)
    full = server.state.resumes.retained_bytes
    assert 60_000 < full <= 65536  # the log holds the newest 64 KiB
    _drop(sessions[1][0])
    await _until(lambda: server.state.sessions == 1)
    assert server.state.resumes.suspended == 1
    assert 0 < server.state.resumes.retained_bytes < full
    async with asyncio.timeout(30):
        ws, error = await _resume(server, sessions[0][1]["resume_token"], 0)
        assert error["code"] == "resume_expired" and "max_suspended_bytes" in error["message"]
        await ws.close()
    assert _metric(server, "gateway_suspended_evicted_total", limit="max_suspended_bytes") == 1


async def test_a_suspended_session_keeps_its_admission(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A door of one: while the admitted session is suspended a new
    conversation waits and is told ``busy``; the resumed session speaks at
    once, without waiting at the door."""
    server = server_factory(resume_window_s=30, max_active_streams=1, admission_deadline_s=0.5)
    ws, created = await _configured(server)
    await send(ws, type="input.text", text="Hello there.")
    await send(ws, type="input.done")
    first = await recv_until(ws, Transcript())
    _drop(ws)
    await _suspended(server, 1)
    assert server.state.sessions == 1  # counted against max_sessions
    assert server.state.admission.active == 1  # and still holding its place
    async with asyncio.timeout(60):
        other, _ = await _configured(server)
        await send(other, type="input.text", text="Let me in.")
        await send(other, type="input.done")
        refused = await recv_until(other, Transcript(), stop="error")
        assert refused.of("error")[0]["code"] == "busy"
        assert not refused.binary
        await other.close()
        ws2, again = await _resume(
            server, created["resume_token"], len(first.binary), 1 + len(first.events)
        )
        assert again["type"] == "session.created"
        assert json.loads(await ws2.recv())["type"] == "session.resumed"
        await send(ws2, type="input.text", text="Still here.")
        await send(ws2, type="input.done")
        second = await recv_until(ws2, Transcript())
        await ws2.close()
    done = second.of("session.done")[0]
    assert done["cancelled"] is False and second.binary
    assert done["metrics"]["admission_wait_ms"] == 0


async def test_resume_attempts_are_rate_limited_per_client_failed_ones_included(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=30, max_resumes_per_minute=3)
    ws, created = await _configured(server)
    _drop(ws)
    await _suspended(server, 1)
    async with asyncio.timeout(30):
        for guess in range(3):  # a client guessing tokens
            guessing, error = await _resume(server, f"{'x' * 40}{guess:03d}", 0)
            assert error["code"] == "resume_invalid"
            await guessing.close()
        for token in ("made-up", created["resume_token"]):  # then even a good one
            ws2, error = await _resume(server, token, 0)
            assert error["code"] == "rate_limited" and error["fatal"] is True
            assert "3 session.resume attempts per minute" in error["message"]
            with pytest.raises(ConnectionClosed) as closed:
                await ws2.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    # the refused attempt never looked at the token: the session is still there
    assert server.state.resumes.suspended == 1
    assert _metric(server, "gateway_resumes_refused_total", reason="resume_invalid") == 3
    assert _metric(server, "gateway_resumes_refused_total", reason="rate_limited") == 2


SENTENCES = {**TAGGED, "split_granularity": "sentence"}


async def test_after_the_window_resume_expired_carries_the_text_not_heard(
    server_factory: Callable[..., RunningServer],
) -> None:
    """One context speaks (paced in real time) and is cut mid-utterance, a
    second holds text waiting for its sentence's end; the window passes.
    The late resume is told what was not heard, per context, once."""
    server = server_factory(resume_window_s=0.5, resume_report_s=60)
    ws, created = await _open(server)
    await send(ws, type="session.config", **SENTENCES)
    assert json.loads(await ws.recv())["type"] == "session.updated"
    await send(ws, type="input.text", text=TEXT, context_id="talk")
    await send(ws, type="input.done", context_id="talk")
    await send(ws, type="input.text", text="It was a bright cold day", context_id="typed")
    before = Transcript()
    async with asyncio.timeout(30):
        while len(before.binary) < 10:
            raw = await ws.recv()
            before.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
    _drop(ws)
    await _suspended(server, 1)
    await _until(lambda: server.state.sessions == 0)  # the window passed
    async with asyncio.timeout(30):
        ws2, error = await _resume(server, created["resume_token"], len(before.binary))
        assert error["code"] == "resume_expired"
        assert "unspoken" in error["message"]
        unspoken = {u["context_id"]: u for u in error["unspoken"]}
        assert unspoken["typed"] == {
            "context_id": "typed",
            "unspoken_text": "It was a bright cold day",
            "truncated": False,
        }
        talk = unspoken["talk"]["unspoken_text"]
        # cut mid-utterance: the rest of the text, from a word boundary on
        assert talk and len(talk) < len(TEXT) and TEXT.endswith(talk)
        assert "Every night its lamp turned slowly over the dark water." in talk
        await ws2.close()
        # given once
        ws3, again = await _resume(server, created["resume_token"], 0)
        assert again["code"] == "resume_expired" and again["unspoken"] is None
        await ws3.close()


async def test_the_report_is_not_kept_past_resume_report_s(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=0.2, resume_report_s=0.3)
    ws, created = await _configured(server)
    await send(ws, type="input.text", text="It was a bright cold day")
    _drop(ws)
    await _suspended(server, 1)
    await _until(lambda: server.state.sessions == 0)
    await asyncio.sleep(0.6)
    async with asyncio.timeout(30):
        ws2, error = await _resume(server, created["resume_token"], 0)
        assert error["code"] == "resume_expired" and error["unspoken"] is None
        await ws2.close()


async def test_the_report_goes_only_to_the_key_that_opened_the_session(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(
        resume_window_s=0.2, resume_report_s=60, api_keys=["key-one", "key-two"]
    )
    mine: dict[str, Any] = {"additional_headers": {"Authorization": "Bearer key-one"}}
    other: dict[str, Any] = {"additional_headers": {"Authorization": "Bearer key-two"}}
    ws, created = await _open(server, **mine)
    await send(ws, type="session.config", **SENTENCES)
    await ws.recv()
    await send(ws, type="input.text", text="It was a bright cold day")
    _drop(ws)
    await _suspended(server, 1)
    await _until(lambda: server.state.sessions == 0)
    async with asyncio.timeout(30):
        ws2, error = await _resume(server, created["resume_token"], 0, **other)
        assert error["code"] == "resume_forbidden" and error["unspoken"] is None
        await ws2.close()
        ws3, error = await _resume(server, created["resume_token"], 0, **mine)
        assert error["code"] == "resume_expired"
        assert error["unspoken"] == [
            {"context_id": None, "unspoken_text": "It was a bright cold day", "truncated": False}
        ]
        await ws3.close()
