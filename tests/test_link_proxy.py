"""``gateway.bench.link.LinkProxy`` over real loopback sockets: it delays
each direction (so a round trip is at least twice the one-way delay), keeps
the bytes' order under jitter, and a cut resets both sides, or only the
client's with the server's left open and silent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from gateway.bench.link import LinkProxy


class Echo:
    """An echo server that records how each of its connections ended."""

    def __init__(self) -> None:
        self.port = 0
        self.received = b""
        self.ends: list[str] = []  #: "eof" or "reset", per ended connection

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                self.received += data
                writer.write(data)
                await writer.drain()
            self.ends.append("eof")
        except ConnectionError:
            self.ends.append("reset")
        writer.close()


@pytest_asyncio.fixture(loop_scope="function")
async def echo() -> AsyncIterator[Echo]:
    echo = Echo()
    server = await asyncio.start_server(echo.handle, "127.0.0.1", 0)
    echo.port = server.sockets[0].getsockname()[1]
    yield echo
    server.close()


async def test_a_round_trip_takes_twice_the_delay_and_keeps_order(
    echo: Echo,
) -> None:
    async with LinkProxy(echo.port, delay_s=0.03, jitter_s=0.02, seed=1) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        start = time.monotonic()
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        assert time.monotonic() - start >= 2 * (0.03 - 0.02)
        sent = b"".join(b"%05d" % i for i in range(2000))
        for i in range(0, len(sent), 50):  # many small writes, each jittered
            writer.write(sent[i : i + 50])
            await asyncio.sleep(0)
        async with asyncio.timeout(10):
            assert await reader.readexactly(len(sent)) == sent
        writer.close()


@pytest.mark.parametrize("server_side", [True, False])
async def test_a_cut_resets_the_client_and_optionally_the_server(
    echo: Echo, server_side: bool
) -> None:
    async with LinkProxy(echo.port, delay_s=0.005) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(b"hello")
        assert await reader.readexactly(5) == b"hello"
        writer.write(b"lost in flight")  # not yet read by the link when it is cut
        assert link.cut(server_side) == 1
        assert link.open_connections() == []
        async with asyncio.timeout(5):
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                await reader.readexactly(1)
            if server_side:
                while not echo.ends:
                    await asyncio.sleep(0.01)
                assert echo.ends == ["reset"]
        if not server_side:  # nothing reaches the server: not the bytes, not the end
            await asyncio.sleep(0.3)
            assert echo.ends == []
        assert echo.received == b"hello"
        writer.close()
    if not server_side:  # closing the link ends the silent side at last
        async with asyncio.timeout(5):
            while not echo.ends:
                await asyncio.sleep(0.01)


async def test_a_planned_cut_loses_what_follows_its_byte(echo: Echo) -> None:
    """The server sent everything; the client gets at most the planned bytes,
    then the connection is lost.  The next connection has its own plan."""
    async with LinkProxy(echo.port, delay_s=0.005) as link:
        link.plan_cuts([300], server_side=True)
        sent = bytes(range(256)) * 4
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(sent)
        got = b""
        async with asyncio.timeout(5):
            with pytest.raises(ConnectionError):
                while data := await reader.read(65536):
                    got += data
            while not echo.ends:
                await asyncio.sleep(0.01)
        assert len(got) <= 300 and got == sent[: len(got)]
        assert echo.received == sent  # the server sent it all back: lost on the way
        writer.close()
        # no plan left: the next connection is not cut
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(sent)
        async with asyncio.timeout(5):
            assert await reader.readexactly(len(sent)) == sent
        writer.close()
