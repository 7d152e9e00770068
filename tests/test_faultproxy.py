"""The fault proxy's own bookkeeping.  The upstream tests judge the gateway
by what the proxy records (``test_cancel_closes_the_upstream_request`` times
``Connection.closed_by_client`` from the cancel), so a client that goes
away must be recorded whichever side of the relay sees it first.

Real sockets on loopback: a listening socket stands for the upstream, a
plain socket for the gateway.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.faultproxy import Connection, FaultProxy, Faults


def _reset(sock: socket.socket) -> None:
    """Close with RST, as a client dropping a response it has not read does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _ended(conn: Connection) -> Connection:
    """``conn`` once the proxy is done with it (both relays ended)."""
    deadline = time.monotonic() + 10
    while conn.closed is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert conn.closed is not None, "the proxy kept the connection open"
    return conn


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.mark.parametrize(
    "faults",
    [Faults(), Faults(stall_after=10), Faults(cut_after=10)],
    ids=["relaying", "the piece before a stall", "the piece before a cut"],
)
def test_a_client_reset_seen_first_on_the_response_side_is_recorded(
    stack: ExitStack, faults: Faults
) -> None:
    """The client resets its connection as the server's next piece arrives:
    the response side meets the reset (its write fails) before the request
    side reads it, and the proxy then stops the request side.  Before the
    fix the piece before ``stall_after``/``cut_after`` was written outside
    the record, so the reset was lost: ``closed_by_client`` stayed None and
    the upstream cancel test saw a gateway that "never closed" (inf s)."""
    upstream = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
    upstream.settimeout(10)
    proxy = FaultProxy(upstream.getsockname()[1])
    stack.callback(proxy.close)
    proxy.faults = faults
    client = stack.enter_context(socket.create_connection(("127.0.0.1", proxy.port), timeout=10))
    server_side = stack.enter_context(upstream.accept()[0])
    client.sendall(b"request")
    assert server_side.recv(64) == b"request"  # relayed: both of its relays run
    with proxy.paused():  # both events reach the proxy's loop in one batch
        _reset(client)
        server_side.sendall(b"x" * 64)
    (conn,) = proxy.connections
    assert _ended(conn).closed_by_client is not None
