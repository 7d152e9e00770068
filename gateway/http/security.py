"""API keys, Host and Origin checks, shared by the HTTP and WebSocket routes.

Keys may come as ``Authorization: Bearer KEY`` (servers), as the query
parameter ``api_key`` or as the WebSocket subprotocol ``tts.key.KEY`` offered
beside ``tts.v1`` (browsers cannot set headers on a WebSocket).  Requests
without an Origin and same-origin pages are allowed; other Origins only when
listed in ``allowed_origins``.

Host (DNS rebinding).  A page on ``evil.example`` whose name is re-pointed at
127.0.0.1 talks to the gateway as a same-origin page: its ``Origin`` and
``Host`` both say ``evil.example``.  The Origin check alone cannot see that;
the Host check can, because the gateway knows its own names: the loopback
names, the ``host`` it is bound to, and ``allowed_hosts``.  Bound to all
interfaces (``0.0.0.0``, ``::``) with no ``allowed_hosts``, the gateway
cannot know its names and accepts any Host; ``startup_warnings`` says so.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from gateway.errors import ErrorCode, GatewayError
from gateway.settings import Settings
from gateway.state import GatewayState

#: names a loopback client may use; never a DNS rebinding target, because a
#: page can only send them as its Host when it really is on this machine
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
#: ``host`` values meaning "every interface"
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "[::]"})


def host_name(header: str) -> str:
    """The name part of a ``Host`` header or ``allowed_hosts`` entry:
    lower-case, without port, IPv6 brackets or a trailing dot."""
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:  # name:port (a bare IPv6 address has several)
        value = value.partition(":")[0]
    return value.rstrip(".")


@dataclass(frozen=True)
class HostPolicy:
    """The Host names this server answers to (see the module docstring)."""

    any_host: bool
    names: frozenset[str]
    suffixes: tuple[str, ...]

    @classmethod
    def from_settings(cls, settings: Settings) -> HostPolicy:
        listed = [h.strip() for h in settings.allowed_hosts if h.strip()]
        bound_everywhere = settings.host.strip() in WILDCARD_BINDS
        any_host = "*" in listed or (bound_everywhere and not listed)
        names = set(LOOPBACK_NAMES)
        if not bound_everywhere:
            names.add(host_name(settings.host))
        suffixes = tuple(host_name(h) for h in listed if h.startswith("."))
        names.update(host_name(h) for h in listed if h != "*" and not h.startswith("."))
        return cls(any_host, frozenset(names), suffixes)

    def allows(self, header: str | None) -> bool:
        if self.any_host:
            return True
        if not header:
            return False
        name = host_name(header)
        return name in self.names or any(name.endswith(s) or name == s[1:] for s in self.suffixes)


def host_ok(conn: HTTPConnection, settings: Settings) -> bool:
    return HostPolicy.from_settings(settings).allows(conn.headers.get("host"))


def host_error(conn: HTTPConnection) -> GatewayError:
    return GatewayError(
        ErrorCode.HOST_NOT_ALLOWED,
        f"Host {host_name(conn.headers.get('host', ''))!r} is not a name of this server;"
        " add it to allowed_hosts",
    )


def origin_error(conn: HTTPConnection) -> GatewayError:
    return GatewayError(
        ErrorCode.ORIGIN_NOT_ALLOWED,
        f"Origin {conn.headers.get('origin')!r} is not allowed; add it to allowed_origins",
    )


def startup_warnings(settings: Settings) -> list[str]:
    """What an operator should hear about at start (exposure, rebinding)."""
    host = settings.host.strip()
    warnings = []
    if host not in LOOPBACK_NAMES and not settings.accepted_keys:
        warnings.append(
            f"listening on {host or 'all interfaces'} without API keys: anyone who can reach"
            " this port can use it; set api_keys (GATEWAY_API_KEYS)"
        )
    if host in WILDCARD_BINDS and not settings.allowed_hosts and not settings.accepted_keys:
        warnings.append(
            "listening on all interfaces with no allowed_hosts: any Host header is accepted,"
            " so a web page can reach the API through DNS rebinding; set allowed_hosts"
            " (GATEWAY_ALLOWED_HOSTS) to the names clients use, or set api_keys"
        )
    return warnings


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
    if not host_ok(conn, state.settings):
        return host_error(conn)
    if not origin_ok(conn, state):
        return origin_error(conn)
    if not key_ok(conn, state):
        return GatewayError(
            ErrorCode.UNAUTHORIZED,
            "missing or invalid API key: send `Authorization: Bearer KEY`, the `api_key`"
            " query parameter, or the subprotocol `tts.key.KEY` beside `tts.v1`",
        )
    return None
