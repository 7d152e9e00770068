"""API keys and Origin checks, shared by the HTTP and WebSocket routes.

Keys may come as ``Authorization: Bearer KEY`` (servers), as the query
parameter ``api_key`` or as the WebSocket subprotocol ``tts.key.KEY`` offered
beside ``tts.v1`` (browsers cannot set headers on a WebSocket).  Requests
without an Origin and same-origin pages are allowed; other Origins only when
listed in ``allowed_origins``.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from gateway.errors import ErrorCode, GatewayError
from gateway.server_state import GatewayState

KEY_SUBPROTOCOL_PREFIX = "tts.key."


def presented_key(conn: HTTPConnection) -> str | None:
    auth = conn.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    if "api_key" in conn.query_params:
        return conn.query_params["api_key"]
    for name in conn.scope.get("subprotocols") or []:
        if name.startswith(KEY_SUBPROTOCOL_PREFIX):
            return str(name[len(KEY_SUBPROTOCOL_PREFIX) :])
    return None


def _matches(given: str, keys: list[str]) -> bool:
    # every key is compared (constant time each), so timing says nothing
    return any([hmac.compare_digest(given.encode(), k.encode()) for k in keys])


def key_ok(conn: HTTPConnection, state: GatewayState) -> bool:
    """The connection presents an accepted key (``api_keys`` or
    ``agent_api_keys``), or none are configured."""
    keys = state.settings.accepted_keys
    if not keys:
        return True
    given = presented_key(conn)
    if given is None:
        return False
    return _matches(given, keys)


def agent_identity(conn: HTTPConnection, state: GatewayState) -> str | None:
    """For a connection presenting one of ``agent_api_keys``: the identity its
    per-client limits are counted under (a digest of the key, never the key
    itself, so it can appear in logs and tables).  ``None`` otherwise: the
    limits are counted per address."""
    keys = state.settings.agent_api_keys
    given = presented_key(conn) if keys else None
    if given is None or not _matches(given, keys):
        return None
    return "key:" + hashlib.sha256(given.encode()).hexdigest()[:12]


def origin_ok(conn: HTTPConnection, state: GatewayState) -> bool:
    origin = conn.headers.get("origin")
    if origin is None:
        return True
    host = conn.headers.get("host", "")
    parts = urlsplit(origin)
    if parts.netloc and parts.netloc == host:
        return True
    return origin.rstrip("/") in {o.rstrip("/") for o in state.settings.allowed_origins}


def check_websocket(conn: HTTPConnection, state: GatewayState) -> GatewayError | None:
    if not origin_ok(conn, state):
        return GatewayError(
            ErrorCode.ORIGIN_NOT_ALLOWED,
            f"Origin {conn.headers.get('origin')!r} is not allowed; add it to allowed_origins",
        )
    if not key_ok(conn, state):
        return GatewayError(
            ErrorCode.UNAUTHORIZED,
            "missing or invalid API key: send `Authorization: Bearer KEY`, the `api_key`"
            " query parameter, or the subprotocol `tts.key.KEY` beside `tts.v1`",
        )
    return None
