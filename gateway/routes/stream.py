"""The WebSocket endpoint ``/v1/audio/speech/stream``: a thin async layer.

It admits the connection, then runs the reader loop: receive a frame,
decode it into a typed message, hand it to the ``Session``.  It never waits
on synthesis.  Everything about state lives in ``gateway.session``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.websockets import WebSocket

from gateway import protocol
from gateway.errors import CloseCode, ErrorCode, GatewayError
from gateway.outbound import ConnectionGone, Outbound
from gateway.pings import SCOPE_KEY as PINGS_KEY
from gateway.pings import PingWatch
from gateway.routes.security import agent_identity, check_websocket
from gateway.server_state import GatewayState, RateLimiter
from gateway.session import Session, State

log = logging.getLogger(__name__)


async def stream_endpoint(websocket: WebSocket) -> None:
    state: GatewayState = websocket.app.state.gateway
    settings = state.settings
    rejection = check_websocket(websocket, state)
    await websocket.accept(subprotocol=_echo_subprotocol(websocket))
    out = Outbound(websocket, state.metrics, settings.stall_timeout_s)
    if rejection is not None:
        await _refuse(out, rejection)
        return
    if state.shutting_down or not state.ready:
        await _refuse(
            out,
            GatewayError(ErrorCode.BUSY, "the server is starting or shutting down; retry"),
            CloseCode.TRY_AGAIN,
        )
        return
    # per-client limits: per agent key when one is presented, else per address
    agent = agent_identity(websocket, state)
    address = websocket.client.host if websocket.client else "unknown"
    client = agent or address
    holder = "this agent key" if agent else "this address"
    per_client = settings.max_sessions_per_agent_key if agent else settings.max_sessions_per_client
    if not state.connection_allowed(client):
        await _refuse(
            out,
            GatewayError(
                ErrorCode.RATE_LIMITED,
                f"more than {settings.max_connections_per_minute} connections per minute"
                f" from {holder}; slow down",
            ),
            CloseCode.POLICY,
        )
        return
    if state.sessions_by_client.get(client, 0) >= per_client:
        await _refuse(
            out,
            GatewayError(ErrorCode.BUSY, f"{holder} already has {per_client} sessions open"),
            CloseCode.TRY_AGAIN,
        )
        return
    if state.sessions >= settings.max_sessions:
        await _refuse(
            out,
            GatewayError(
                ErrorCode.BUSY, f"the server is at its limit of {settings.max_sessions} sessions"
            ),
            CloseCode.TRY_AGAIN,
        )
        return
    session = Session(
        out,
        state.engine,
        settings,
        state.metrics,
        state.admission,
        websocket.app.state.voice_store,
    )
    state.sessions += 1
    state.sessions_by_client[client] = state.sessions_by_client.get(client, 0) + 1
    state.live_sessions.add(session)
    state.metrics.sessions_active.inc()
    session.log.info("session opened from %s%s", address, f" ({agent})" if agent else "")
    try:
        await out.event(session.created_message())
        await _read_loop(websocket, session)
    except ConnectionGone:
        pass
    finally:
        await session.shutdown()
        state.sessions -= 1
        state.sessions_by_client[client] -= 1
        if not state.sessions_by_client[client]:
            del state.sessions_by_client[client]
        state.live_sessions.discard(session)
        state.metrics.sessions_active.dec()
        session.log.info("session closed")


async def _read_loop(websocket: WebSocket, session: Session) -> None:
    settings = session.settings
    rate = RateLimiter(settings.max_messages_per_second, 1.0)
    last_rate_error = 0.0
    first = True
    pings: PingWatch | None = websocket.scope.get(PINGS_KEY)
    #: when the idle period began: the last client message, ping frame or
    #: moment audio was still being produced
    active_at = time.monotonic()
    while session.state is State.OPEN:
        if first:
            timeout = settings.config_timeout_s
        else:
            timeout = max(0.0, active_at + settings.idle_timeout_s - time.monotonic())
        try:
            # asyncio.timeout: wait_for (3.11) can swallow a cancel of this task
            async with asyncio.timeout(timeout):
                frame = await websocket.receive()
        except TimeoutError:
            if not first:
                if pings is not None and pings.last is not None and pings.last > active_at:
                    active_at = pings.last  # a ping frame: the client is there
                    continue
                if session.producing():
                    active_at = time.monotonic()  # audio still going out: not idle
                    continue
            which = "config" if first else "idle"
            limit = settings.config_timeout_s if first else settings.idle_timeout_s
            quiet = "no message" if first else "no message or ping"
            code = CloseCode.CONFIG_TIMEOUT if first else CloseCode.IDLE_TIMEOUT
            await session.out.event(
                protocol.Error(
                    code=ErrorCode.TIMEOUT,
                    message=f"{which} timeout: {quiet} for {limit:g} s",
                    fatal=True,
                )
            )
            await session.close(code, f"{which} timeout")
            return
        first = False
        active_at = time.monotonic()
        if frame["type"] == "websocket.disconnect":
            session.connection_lost()
            return
        if not rate.allow():
            now = time.monotonic()
            if now - last_rate_error >= 1.0:  # one error a second, not one per message
                last_rate_error = now
                await session.report_error(
                    GatewayError(
                        ErrorCode.RATE_LIMITED,
                        f"over {settings.max_messages_per_second} messages per second;"
                        " messages are being dropped",
                    )
                )
            continue
        text = frame.get("text")
        if text is None:
            error = GatewayError(
                ErrorCode.INVALID_MESSAGE,
                "binary frames from the client are not part of the protocol; send JSON text",
            )
            await session.report_error(error)
            continue
        message: protocol.ClientMessage | None = None
        try:
            message = protocol.decode_client(text)
            if not await session.handle(message):
                return
        except GatewayError as error:
            context_id = getattr(message, "context_id", None)
            if await session.report_error(error, context_id):
                return


def _echo_subprotocol(websocket: WebSocket) -> str | None:
    """Browsers that send their key as a subprotocol need one echoed back."""
    offered = websocket.scope.get("subprotocols") or []
    return "tts.v1" if "tts.v1" in offered else None


async def _refuse(out: Outbound, error: GatewayError, code: int | None = None) -> None:
    """Accept-then-explain-then-close, so browsers can see why."""
    spec = error.code.spec
    try:
        await out.event(protocol.Error(code=error.code, message=error.message, fatal=True))
    except ConnectionGone:
        return
    await out.close(code or spec.close_code or CloseCode.POLICY, str(error.code))
