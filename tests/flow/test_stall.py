"""The stall rule, in one place: a client that stops reading for
``stall_timeout_s`` is dropped, its slot and engine work freed.

The guard itself without a server (``gateway.flow.stall``), then the two
surfaces on a real server with clients whose receive buffers are small and
that stop reading: a WebSocket is closed with 4008 (and its deferred abort
logs nothing), a streamed HTTP response is cut short.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable

import httpx
import pytest

from gateway.engines.base import Engine
from gateway.flow.stall import Stalled, StallGuard
from gateway.ws.outbound import STALL_CLOSE_TIMEOUT_S
from tests.conftest import LogCollector, RunningServer, no_traceback
from tests.flow.test_backpressure import PARAGRAPH, _only_connection, _start_raw
from tests.rawws import Closed


async def test_stall_guard_raises_stalled_past_the_timeout() -> None:
    guard = StallGuard(0.01)
    with pytest.raises(Stalled):
        async with guard.send():
            await asyncio.sleep(1)
    async with StallGuard(None).send():
        await asyncio.sleep(0)  # no timeout: never stalls


async def test_stall_timeout_closes_4008_and_frees_the_session(
    server_factory: Callable[..., RunningServer], piper_engine: Engine, server_log: LogCollector
) -> None:
    server = server_factory(stall_timeout_s=1.0)
    baseline_jobs = piper_engine.live_jobs()
    # a client that resumes reading within the close timeout sees the close
    client = await _start_raw(server)
    session = _only_connection(server)
    async with asyncio.timeout(30):
        while not session.out.stalled:
            await asyncio.sleep(0.05)
    frames = 1
    async with asyncio.timeout(10):
        while True:
            message = await client.recv()
            if isinstance(message, Closed):
                break
            frames += isinstance(message, bytes)
    client.close()
    assert message.code == 4008
    assert frames > 10
    # the deferred abort after that close must not fail on the closed transport
    await asyncio.sleep(STALL_CLOSE_TIMEOUT_S + 0.5)
    assert "AttributeError" not in server_log.text, server_log.text
    no_traceback(server_log)
    # a client that never reads again: aborted after the close timeout
    silent = await _start_raw(server)
    session = _only_connection(server)
    async with asyncio.timeout(30):
        while not session.out.stalled:
            await asyncio.sleep(0.05)
    stalled_at = time.monotonic()
    async with asyncio.timeout(10):
        while server.state.sessions:
            await asyncio.sleep(0.05)
    freed_after = time.monotonic() - stalled_at
    print(f"session freed {freed_after:.2f} s after the stall")
    assert freed_after < 4.0
    async with asyncio.timeout(10):
        while piper_engine.live_jobs() > baseline_jobs:
            await asyncio.sleep(0.05)
    silent.close()


async def _stalled_http_reader(server: RunningServer, body: bytes) -> socket.socket:
    """Post a streamed speech request with a 4 KiB receive buffer and never
    read the response."""
    host, port = server.http.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    await loop.sock_sendall(sock, head.encode() + body)
    return sock


async def _drained(sock: socket.socket, limit_s: float) -> bytes:
    """Everything the server sent, up to its end of the connection."""
    loop = asyncio.get_running_loop()
    data = bytearray()
    async with asyncio.timeout(limit_s):
        while True:
            try:
                piece = await loop.sock_recv(sock, 65536)
            except ConnectionResetError:
                return bytes(data)
            if not piece:
                return bytes(data)
            data += piece


async def _until(check: Callable[[], bool], limit_s: float) -> None:
    async with asyncio.timeout(limit_s):
        while not check():
            await asyncio.sleep(0.05)


async def test_http_readers_that_stop_reading_are_dropped_after_the_stall_timeout(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Streamed HTTP responses nobody reads used to hold every
    ``max_http_streams`` slot (and their engine work) forever."""
    # no admission queue: the fourth request is refused at once, not served
    # once the stall timeout frees a slot
    server = server_factory(stall_timeout_s=1.0, max_http_streams=3, admission_queue_length=0)
    state = server.state
    # minutes of audio: far more than any kernel buffer holds
    body = json.dumps({"voice": "joe", "input": PARAGRAPH * 20, "response_format": "pcm"})
    readers = [await _stalled_http_reader(server, body.encode()) for _ in range(3)]
    try:
        await _until(lambda: state.http_admission.active == 3, 30)
        refused = await asyncio.to_thread(
            httpx.post,
            server.http + "/v1/audio/speech",
            json={"voice": "joe", "input": "Hello.", "response_format": "pcm"},
            timeout=30,
        )
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "busy"
        # the stall timeout drops them: slots free, engine work stopped
        await _until(lambda: state.http_admission.active == 0, 30)
        await _until(lambda: state.engine.live_jobs() == 0, 10)
        for sock in readers:
            received = await _drained(sock, 20)
            assert received.startswith(b"HTTP/1.1 200")
            assert not received.endswith(b"0\r\n\r\n")  # cut short, never a clean end
        ok = await asyncio.to_thread(
            httpx.post,
            server.http + "/v1/audio/speech",
            json={"voice": "joe", "input": "Hello there.", "response_format": "pcm"},
            timeout=30,
        )
        assert ok.status_code == 200 and len(ok.content) > 1000
        await _until(lambda: state.http_admission.active == 0, 5)
    finally:
        for sock in readers:
            sock.close()
