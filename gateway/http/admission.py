"""HTTP admission: whom a speech request counts as in the admission queue
(``gateway.flow.admission``, shared with the WebSocket) and the ``503 busy``
of a request refused a slot.  Used by the single route (which waits up to
``admission_deadline_s``, and leaves the queue when its client disconnects:
``disconnected``) and by batch items (which wait as long as
needed)."""

from __future__ import annotations

from starlette.requests import Request

from gateway.errors import ErrorCode, GatewayError
from gateway.flow.admission import AdmissionGate, Ticket
from gateway.http.security import agent_identity
from gateway.state import GatewayState


def http_client(request: Request, state: GatewayState) -> str:
    """Whom admission's fairness counts a request as: its agent key, else its address."""
    agent = agent_identity(request, state)
    return agent or (request.client.host if request.client else "unknown")


def http_busy(slots: AdmissionGate, ticket: Ticket) -> GatewayError:
    """The ``503 busy`` (with ``Retry-After``) of a request refused a slot."""
    queue = slots.queue
    if ticket.refusal == "draining":
        why = "the server is draining (shutting down); send it to another server"
    elif ticket.refusal == "deadline":
        why = (
            f"no slot came free within {queue.deadline_s:g} s (all {queue.limit} HTTP"
            " speech slots in use); retry after Retry-After"
        )
    else:
        why = (
            f"all {queue.limit} HTTP speech slots are in use and the admission queue is full;"
            " retry after Retry-After"
        )
    return GatewayError(ErrorCode.BUSY, why, retry_after_s=ticket.retry_after_s)


async def disconnected(request: Request) -> None:
    """Completes when the client of ``request`` disconnects: ``acquire``'s
    ``gone`` for a request whose body has been read, so that the next ASGI
    message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
