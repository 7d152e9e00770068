"""A TCP fault proxy for tests: a real asyncio socket relay on loopback
that can delay, stall, reset, or cut a response mid-body, and records when
each connection opened and closed.

It runs its own event loop in a daemon thread, so the process's other
servers (uvicorn threads) and the test's own loop are independent of it.
Faults are set between requests (plain attribute writes; the relay reads
them when a connection is accepted or a response piece arrives):

* ``refuse``: stop listening (connection refused), ``resume`` to listen
  again on the same port;
* ``reset``: accept, then close the client's socket with RST before any reply;
* ``delay_s``: hold the response's first bytes this long;
* ``hold``: hold the response's first bytes until this ``threading.Event``
  is set (an event, where a test must not depend on how long a wait is);
* ``stall_after``: forward this many response bytes, then forward nothing
  more (the connection stays open);
* ``cut_after``: forward this many response bytes, then close both sides.

``paused`` holds the proxy's loop for a block, so that events happening
meanwhile reach it together (its own tests race a client's reset against
the response's last piece that way).

Each connection keeps the first 64 KiB its client sent (``request_sample``),
so a test can read what a gateway asked its upstream for.

What it is not: an HTTP parser.  Byte counts are of the raw response,
headers included.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

#: how much of each request the proxy keeps for a test to read
REQUEST_SAMPLE_BYTES = 65536


@dataclass
class Connection:
    opened: float
    closed_by_client: float | None = None  #: the client side sent EOF or reset
    closed: float | None = None
    request_bytes: int = 0
    response_bytes: int = 0
    #: the first ``REQUEST_SAMPLE_BYTES`` the client sent (headers and body)
    request_sample: bytearray = field(default_factory=bytearray)


@dataclass
class Faults:
    reset: bool = False
    delay_s: float = 0.0
    hold: threading.Event | None = None
    stall_after: int | None = None
    cut_after: int | None = None


@dataclass
class FaultProxy:
    target_port: int
    faults: Faults = field(default_factory=Faults)
    connections: list[Connection] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread.start()
        self.resume()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    def resume(self) -> None:
        async def listen() -> None:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self.port))
            self._server = await asyncio.start_server(self._handle, sock=sock)

        if self._server is None:
            self._sock.close()
            self._call(listen())

    def refuse(self) -> None:
        """Stop listening and drop every open connection."""

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                self._server = None
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        self._call(stop())

    def close(self) -> None:
        self.refuse()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the proxy's event loop for the block: what happens on its
        sockets meanwhile (a client's reset, a server's bytes) is handled
        together when it resumes, so a test can make two events race."""
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            holding.set()
            release.wait(10)

        self._loop.call_soon_threadsafe(hold)
        assert holding.wait(10), "the proxy's loop did not come to the hold"
        try:
            yield
        finally:
            release.set()

    def open_connections(self) -> list[Connection]:
        return [c for c in self.connections if c.closed is None]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = Connection(time.monotonic())
        self.connections.append(conn)
        upstream: asyncio.StreamWriter | None = None
        try:
            if self.faults.reset:
                await reader.read(1)  # the request started: then reset it
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
            to_server = asyncio.create_task(self._requests(reader, upstream, conn))
            try:
                await self._responses(up_reader, writer, conn, to_server)
            finally:
                to_server.cancel()
                await asyncio.gather(to_server, return_exceptions=True)
        except (ConnectionError, OSError):
            pass
        finally:
            self._tasks.discard(task)
            for w in (writer, upstream):
                if w is not None:
                    w.close()
            conn.closed = time.monotonic()

    async def _requests(
        self, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter, conn: Connection
    ) -> None:
        try:
            while data := await reader.read(65536):
                room = REQUEST_SAMPLE_BYTES - len(conn.request_sample)
                conn.request_sample += data[: max(room, 0)]
                conn.request_bytes += len(data)
                upstream.write(data)
                await upstream.drain()
        except (ConnectionError, OSError):
            pass
        if conn.closed_by_client is None:
            conn.closed_by_client = time.monotonic()
        # the client went away: take the server side down too, as a real
        # connection would, so the response relay ends
        upstream.close()

    async def _responses(
        self,
        up_reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: Connection,
        client_gone: asyncio.Task[None],
    ) -> None:
        first = True
        while data := await up_reader.read(4096):
            faults = self.faults  # read live: a test may change them between requests
            if first and faults.delay_s:
                await asyncio.sleep(faults.delay_s)
            if first and faults.hold is not None:
                while not faults.hold.is_set():
                    await asyncio.sleep(0.005)
            first = False
            for limit, action in ((faults.cut_after, "cut"), (faults.stall_after, "stall")):
                if limit is not None and conn.response_bytes + len(data) > limit:
                    data = data[: max(0, limit - conn.response_bytes)]
                    if data:
                        await self._to_client(writer, data, conn)
                    if action == "stall":
                        await asyncio.wait({client_gone})  # silent until the client leaves
                    return
            await self._to_client(writer, data, conn)

    @staticmethod
    async def _to_client(writer: asyncio.StreamWriter, data: bytes, conn: Connection) -> None:
        """Relay a piece of the response: every write to the client goes
        through here.  A client that went away may show on this side first
        (a reset on write, or the reader's error that ``drain`` raises once
        the loop saw the reset) and ``_handle`` then cancels ``_requests``
        before it can note it, so it is noted here: on every write, the
        last piece before a ``stall_after`` or ``cut_after`` included."""
        writer.write(data)
        conn.response_bytes += len(data)
        try:
            await writer.drain()
        except (ConnectionError, OSError):
            if conn.closed_by_client is None:
                conn.closed_by_client = time.monotonic()
            raise
