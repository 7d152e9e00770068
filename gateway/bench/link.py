"""A network link between a client and a server, for tests and benchmarks:
a TCP relay on loopback that delays each direction by a one-way delay with
jitter, and can cut its connections.

What it is for: ``session.resume`` is about links that drop, and how long
a resume takes is a count of round trips, so a benchmark of it needs a link
with a round-trip time (``bench/resume_drops.py``) and a test needs a cut
that the client did not choose to make (``tests/test_resume_drops.py``).
``tests/faultproxy.py`` breaks HTTP responses; this one shapes a link.

* Every chunk read from one side is written to the other at
  ``arrival + delay_s + uniform(-jitter_s, +jitter_s)``, never before the
  chunk read before it (TCP keeps order: jitter delays, it never reorders).
* ``cut()`` ends every open connection at once, as a link that fails: what
  is still in flight is lost, and each side gets a reset (``SO_LINGER`` 0).
  With ``server_side=False`` the server's side is left open and silent (no
  byte relayed, no reset) until ``close``, as when a client's network goes
  away and nothing tells the server.
* ``plan_cuts([n, ...])``: the next connections accepted, one limit each,
  are cut once ``n`` bytes have reached the client: the server wrote more,
  and it is lost (a cut at a byte, not between messages, and whatever the
  client was doing).

What it must not do: parse anything (it relays bytes), or hold an unbounded
amount: each direction keeps at most ``max_chunks`` chunks in flight, then
stops reading (the sender's TCP window fills, as on a slow link).

It runs on the event loop that calls ``start``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

#: chunks in flight per direction before the relay stops reading
MAX_CHUNKS = 1024
READ_BYTES = 65536


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST: the peer sees the connection lost, not a clean end."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(eq=False)
class LinkConnection:
    """One relayed connection: its two sockets and the tasks that pump them."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    opened: float
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    cut: bool = False
    closed: bool = False
    #: a planned cut: after this many bytes to the client (``plan_cuts``)
    cut_after_bytes: int | None = None
    cut_server_side: bool = True
    to_client_bytes: int = 0

    def end(self, server_side: bool = True) -> None:
        """Cut: reset the client's side (and the server's, unless told not to)."""
        self.cut = True
        for task in self.tasks:
            task.cancel()
        _reset(self.client)
        if server_side:
            _reset(self.server)


class LinkProxy:
    def __init__(
        self,
        target_port: int,
        *,
        delay_s: float = 0.0,
        jitter_s: float = 0.0,
        seed: int | None = None,
        target_host: str = "127.0.0.1",
        max_chunks: int = MAX_CHUNKS,
    ) -> None:
        if delay_s < 0 or jitter_s < 0 or jitter_s > delay_s:
            raise ValueError("need 0 <= jitter_s <= delay_s")
        self.target = (target_host, target_port)
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.max_chunks = max_chunks
        self._random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self.port = 0
        self.connections: list[LinkConnection] = []
        self._planned: deque[tuple[int, bool]] = deque()

    @property
    def rtt_s(self) -> float:
        """The nominal round trip: twice the one-way delay."""
        return 2 * self.delay_s

    def url(self, scheme: str = "ws", path: str = "") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    async def start(self) -> LinkProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in self.connections:
            if not conn.closed:
                conn.end()
        await asyncio.gather(
            *(t for c in self.connections for t in c.tasks), return_exceptions=True
        )
        for conn in self.connections:
            conn.server.close()

    async def __aenter__(self) -> LinkProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def open_connections(self) -> list[LinkConnection]:
        return [c for c in self.connections if not c.closed and not c.cut]

    def cut(self, server_side: bool = True) -> int:
        """Fail the link: every open connection ends now, what is in flight
        is lost.  The number of connections cut."""
        live = self.open_connections()
        for conn in live:
            conn.end(server_side)
        return len(live)

    def plan_cuts(self, after_bytes: Iterable[int], server_side: bool = True) -> None:
        """Cut each of the next connections accepted once its limit of
        bytes has reached the client (one limit per connection, in order)."""
        self._planned.extend((n, server_side) for n in after_bytes)

    def forget_plans(self) -> None:
        """Planned cuts not yet given to a connection are dropped."""
        self._planned.clear()

    def _one_way(self) -> float:
        return self.delay_s + self._random.uniform(-self.jitter_s, self.jitter_s)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        conn = LinkConnection(writer, up_writer, time.monotonic())
        if self._planned:
            conn.cut_after_bytes, conn.cut_server_side = self._planned.popleft()
        self.connections.append(conn)
        conn.tasks = [
            asyncio.create_task(self._pipe(reader, up_writer, conn, to_client=False)),
            asyncio.create_task(self._pipe(up_reader, writer, conn, to_client=True)),
        ]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        conn.closed = True
        if not conn.cut:
            for w in (writer, up_writer):
                w.close()

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        conn: LinkConnection,
        to_client: bool,
    ) -> None:
        """Relay one direction with the link's delay (a FIN too); a reset ends both."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(self.max_chunks)
        writer = asyncio.create_task(self._deliver(queue, sink, conn if to_client else None))
        try:
            due = 0.0
            while data := await source.read(READ_BYTES):
                # never before the previous chunk: jitter without reordering
                due = max(due, time.monotonic() + self._one_way())
                await queue.put((due, data))
            await queue.put((due, b""))  # the end (FIN), after everything before it
            await writer
        except (ConnectionError, OSError):
            # a reset on one side: the other side's relay ends too
            for task in conn.tasks:
                if task is not asyncio.current_task():
                    task.cancel()
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    @staticmethod
    async def _deliver(
        queue: asyncio.Queue[tuple[float, bytes]],
        sink: asyncio.StreamWriter,
        to_client: LinkConnection | None,
    ) -> None:
        """Write each chunk when it is due; ``to_client``: the connection
        whose planned cut this direction's bytes count toward."""
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if sink.can_write_eof():
                    sink.write_eof()
                return
            conn = to_client
            if conn is not None and conn.cut_after_bytes is not None:
                room = conn.cut_after_bytes - conn.to_client_bytes
                if len(data) >= room:
                    sink.write(data[: max(room, 0)])
                    conn.to_client_bytes += max(room, 0)
                    await _flushed(sink)
                    conn.end(conn.cut_server_side)
                    return
                conn.to_client_bytes += len(data)
            sink.write(data)
            await sink.drain()


async def _flushed(writer: asyncio.StreamWriter, limit_s: float = 1.0) -> None:
    """Wait (a while at most) until what was written left for the kernel:
    with no high-water mark, ``drain`` returns only on an empty buffer."""
    writer.transport.set_write_buffer_limits(high=0)
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(limit_s):
            await writer.drain()
