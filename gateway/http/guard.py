"""The HTTP API's guard: Host, Origin and per-client limits, before routing.

``ApiGuard`` is a pure ASGI middleware in front of every ``/v1/`` HTTP
request (the WebSocket endpoint runs the same Host and Origin checks itself,
so that it can explain a refusal in an ``error`` event before closing):

1. ``Host`` must be a name of this server (``routes.security.HostPolicy``):
   otherwise 403 ``host_not_allowed`` (DNS rebinding);
2. a request that changes state or costs synthesis (any method but GET,
   HEAD and OPTIONS) from a browser page must come from an Origin the
   WebSocket would accept: otherwise 403 ``origin_not_allowed`` (CORS stops a
   foreign page from *reading* the answer, not from sending a form or a
   ``text/plain`` POST, nor the CPU it costs);
3. per client address: at most ``max_http_requests_per_minute`` requests
   (the token bucket the WebSocket uses for connections per minute) and at
   most ``max_http_requests_per_client`` in progress at once; otherwise 429
   ``rate_limited`` with ``Retry-After``.  A request is in progress until its
   response body has been sent (a streamed speech response counts all along).

``/healthz``, ``/health``, ``/readyz``, ``/metrics`` and the demo page are not guarded:
they change nothing, and orchestrators probe them by IP address.

What it must not do: read request bodies (the routes cap and parse them).
"""

from __future__ import annotations

import math

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import ErrorCode, GatewayError
from gateway.http.errors import error_response
from gateway.http.security import HostPolicy, host_error, origin_error, origin_ok
from gateway.state import GatewayState, RateLimiter

API_PREFIX = "/v1/"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: client addresses remembered by a rate table before it is cleared (bounds memory)
MAX_TRACKED_CLIENTS = 10_000


class ClientRates:
    """A token bucket per client address, as ``GatewayState.connection_allowed``
    keeps for WebSocket connections; the table is bounded."""

    def __init__(self, rate: float, per_s: float) -> None:
        self.rate = rate
        self.per_s = per_s
        self._buckets: dict[str, RateLimiter] = {}

    def allow(self, client: str) -> bool:
        if len(self._buckets) > MAX_TRACKED_CLIENTS:
            self._buckets.clear()
        bucket = self._buckets.get(client)
        if bucket is None:
            bucket = self._buckets[client] = RateLimiter(self.rate, self.per_s)
        return bucket.allow()

    def retry_after_s(self, client: str) -> int:
        """Whole seconds until the client's bucket holds a token again."""
        bucket = self._buckets.get(client)
        if bucket is None or bucket.tokens >= 1:
            return 1
        return max(1, math.ceil((1 - bucket.tokens) / bucket.refill))


class ClientConcurrency:
    """Requests in progress per client address."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active: dict[str, int] = {}

    def try_acquire(self, client: str) -> bool:
        count = self.active.get(client, 0)
        if count >= self.limit:
            return False
        self.active[client] = count + 1
        return True

    def release(self, client: str) -> None:
        count = self.active.get(client, 0) - 1
        if count > 0:
            self.active[client] = count
        else:
            self.active.pop(client, None)


class ApiGuard:
    def __init__(self, app: ASGIApp, state: GatewayState) -> None:
        self.app = app
        self.state = state
        settings = state.settings
        self.hosts = HostPolicy.from_settings(settings)
        self.rates = ClientRates(settings.max_http_requests_per_minute, 60.0)
        self.concurrency = ClientConcurrency(settings.max_http_requests_per_client)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        refusal, headers = self._refusal(conn)
        if refusal is not None:
            response = error_response(refusal, self.state)
            response.headers.update(headers)
            await response(scope, receive, send)
            return
        client = _client(conn)
        if not self.concurrency.try_acquire(client):
            limit = self.concurrency.limit
            refused = GatewayError(
                ErrorCode.RATE_LIMITED,
                f"this address already has {limit} HTTP API requests in progress"
                f" (max_http_requests_per_client); wait for one to finish",
            )
            response = error_response(refused, self.state)
            response.headers["Retry-After"] = "1"
            await response(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.concurrency.release(client)

    def _refusal(self, conn: HTTPConnection) -> tuple[GatewayError | None, dict[str, str]]:
        if not self.hosts.allows(conn.headers.get("host")):
            return host_error(conn), {}
        if conn.scope.get("method", "GET") not in SAFE_METHODS and not origin_ok(conn, self.state):
            return origin_error(conn), {}
        client = _client(conn)
        if not self.rates.allow(client):
            per_minute = self.state.settings.max_http_requests_per_minute
            error = GatewayError(
                ErrorCode.RATE_LIMITED,
                f"more than {per_minute} HTTP API requests per minute from this address"
                " (max_http_requests_per_minute); slow down",
            )
            return error, {"Retry-After": str(self.rates.retry_after_s(client))}
        return None, {}


def _client(conn: HTTPConnection) -> str:
    return conn.client.host if conn.client else "unknown"
