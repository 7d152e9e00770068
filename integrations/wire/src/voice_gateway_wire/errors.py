"""The gateway's error registry as a client needs it: each code's HTTP status.

The source is ``gateway.errors`` (and the table in ``docs/protocol.md#errors``);
the gateway's test suite fails when this copy drifts from it.  A plugin maps a
WebSocket ``error`` event to the HTTP status the HTTP API would answer, so a
framework's retry logic (LiveKit's ``APIStatusError``) treats both alike.
"""

from __future__ import annotations

from typing import Final

#: code -> HTTP status, in the registry's order
ERROR_STATUS: Final[dict[str, int]] = {
    "invalid_json": 400,
    "invalid_message": 400,
    "unknown_type": 400,
    "invalid_config": 400,
    "unknown_voice": 400,
    "unsupported_option": 400,
    "invalid_state": 409,
    "text_too_long": 400,
    "message_too_large": 413,
    "unauthorized": 401,
    "origin_not_allowed": 403,
    "host_not_allowed": 403,
    "busy": 503,
    "rate_limited": 429,
    "timeout": 408,
    "listener_silent": 408,
    "engine_refused": 400,
    "invalid_ssml": 400,
    "not_found": 404,
    "internal": 500,
    "resume_invalid": 400,
    "resume_expired": 410,
    "resume_forbidden": 403,
    "resume_elsewhere": 421,
}


def error_status(code: object) -> int:
    """HTTP status of a gateway error code (500 for a code this package does not know)."""
    return ERROR_STATUS.get(str(code), 500)
