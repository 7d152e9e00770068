"""A loopback TCP proxy that can drop every connection at once (a network
fault between the agent and the gateway; the gateway itself stays up)."""

from __future__ import annotations

import asyncio
import contextlib


class DroppingProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def drop_all(self) -> None:
        """Abort every proxied connection (both sides see a reset)."""
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def aclose(self) -> None:
        self.drop_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
