"""HTTP error responses in OpenAI's shape, driven by the error registry.

Every HTTP error the gateway answers is ``{"error": {"message", "type",
"param", "code"}}`` with the status and ``type`` of its ``ErrorCode``
(``gateway/errors.py``), so the WebSocket and HTTP surfaces share one table.
Also here: reading a request body with a size cap, the API-key check
for HTTP routes, and ``internal_error`` (a bug: logged, never shown).

What it must not do: invent statuses or types outside the registry.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.delivery.segment import INTERNAL_MESSAGE
from gateway.errors import BUSY_RETRY_AFTER_S, ErrorCode, GatewayError
from gateway.http.security import key_ok
from gateway.state import GatewayState

log = logging.getLogger(__name__)


def error_body(error: GatewayError) -> dict[str, Any]:
    return {
        "error": {
            "message": error.message,
            "type": error.code.spec.openai_type,
            "param": error.param,
            "code": str(error.code),
        }
    }


def internal_error(what: str) -> GatewayError:
    """A bug in the gateway while doing ``what``, called in the ``except``
    block: the traceback goes to the log, the client gets ``internal`` with
    no exception text."""
    log.exception("HTTP %s broke", what)
    return GatewayError(ErrorCode.INTERNAL, INTERNAL_MESSAGE)


def error_response(error: GatewayError, state: GatewayState | None = None) -> JSONResponse:
    if state is not None:
        state.metrics.errors.labels(code=str(error.code)).inc()
    headers = None
    if error.code is ErrorCode.BUSY:
        retry = (
            BUSY_RETRY_AFTER_S
            if error.retry_after_s is None
            else max(1, math.ceil(error.retry_after_s))
        )
        headers = {"Retry-After": str(retry)}
    return JSONResponse(error_body(error), status_code=error.code.spec.http_status, headers=headers)


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def check_request(request: Request) -> GatewayError | None:
    """API key and readiness, for every HTTP API route."""
    state = gateway_state(request)
    if not key_ok(request, state):
        return GatewayError(
            ErrorCode.UNAUTHORIZED,
            "missing or invalid API key: send `Authorization: Bearer KEY`",
        )
    if not state.ready or state.shutting_down:
        return GatewayError(ErrorCode.BUSY, "the server is starting or shutting down")
    return None


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise GatewayError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"request body of {declared} bytes is over the limit of {limit} bytes",
        )
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise GatewayError(
                ErrorCode.MESSAGE_TOO_LARGE, f"request body is over the limit of {limit} bytes"
            )
    return bytes(body)
