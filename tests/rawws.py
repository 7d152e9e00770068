"""A minimal WebSocket client over a raw socket, for backpressure tests.

The socket's receive buffer is set before ``connect`` (so the TCP window is
small from the handshake on) and nothing is read unless the test asks: a
client that "stops reading" really leaves the bytes in the server's buffers.
The protocol work is websockets' sans-I/O ``ClientProtocol``.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri


@dataclass
class Closed:
    code: int | None


class RawClient:
    def __init__(self, url: str, rcvbuf: int = 4096) -> None:
        self.url = url
        self.rcvbuf = rcvbuf
        parsed = urlparse(url)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self._address = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.proto = ClientProtocol(parse_uri(url), max_size=None)
        self._pending: list[Any] = []
        self.closed: Closed | None = None

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        self.sock.setblocking(False)
        await loop.sock_connect(self.sock, self._address)
        self.proto.send_request(self.proto.connect())
        await self._flush()
        while not any(isinstance(e, Response) for e in self._pending):
            await self._read_some()
        response = next(e for e in self._pending if isinstance(e, Response))
        self._pending.remove(response)
        assert response.status_code == 101, response.status_code

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        for data in self.proto.data_to_send():
            if data:
                await loop.sock_sendall(self.sock, data)

    async def _read_some(self) -> None:
        data = await asyncio.get_running_loop().sock_recv(self.sock, 65536)
        if data:
            self.proto.receive_data(data)
        else:
            self.proto.receive_eof()
        self._pending.extend(self.proto.events_received())
        await self._flush()  # pongs, close replies
        if not data and not self._pending:
            self.closed = self.closed or Closed(None)

    async def send_json(self, **message: Any) -> None:
        self.proto.send_text(json.dumps(message).encode())
        await self._flush()

    async def recv(self) -> dict[str, Any] | bytes | Closed:
        """The next message: a decoded JSON event, a binary payload, or
        ``Closed`` (close frame code, or ``None`` for a lost connection)."""
        while True:
            while self._pending:
                frame = self._pending.pop(0)
                if frame.opcode is Opcode.TEXT:
                    return dict(json.loads(frame.data.decode()))
                if frame.opcode is Opcode.BINARY:
                    return bytes(frame.data)
                if frame.opcode is Opcode.CLOSE:
                    rcvd = self.proto.close_rcvd
                    self.closed = Closed(rcvd.code if rcvd else None)
                    return self.closed
            if self.closed is not None:
                return self.closed
            try:
                await self._read_some()
            except (ConnectionResetError, BrokenPipeError):
                self.closed = Closed(None)

    def abort(self) -> None:
        linger_zero = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # reset, no FIN
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger_zero)
        self.sock.close()

    def close(self) -> None:
        self.sock.close()
