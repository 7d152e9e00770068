"""What the session core asks its route to do, besides sending messages.

``Session.handle`` returns a list of ``Action``: server messages to send, in
order, and these requests, which the route (``gateway.ws.endpoint``)
performs.  Plain values: no behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway import protocol
from gateway.errors import CloseCode, GatewayError
from gateway.session.voice_requests import VoiceRequest


@dataclass(frozen=True)
class Close:
    """Close the connection (after cancelling and reporting its work)."""

    code: int
    reason: str


@dataclass(frozen=True)
class AnswerVoiceRequest:
    """A ``voice.*`` request for the route to answer (``gateway.session.voice_requests``)."""

    request: VoiceRequest


@dataclass(frozen=True)
class CloseWhenDone:
    """``session.close``: close with ``code`` once the session has nothing
    left to speak (``busy`` is false), or after ``drain_timeout_s``
    (``Close`` then cancels and reports the rest); keep reading meanwhile."""

    code: int
    reason: str


Action = protocol.ServerMessage | Close | CloseWhenDone | AnswerVoiceRequest


def messages_only(actions: list[Action]) -> list[protocol.ServerMessage]:
    """The server messages among ``actions`` (what an audio stream can send)."""
    return [a for a in actions if not isinstance(a, Close | CloseWhenDone | AnswerVoiceRequest)]


def error_actions(
    error: GatewayError,
    context_id: str | None,
    *,
    config_accepted: bool,
    request_id: protocol.RequestId = None,
    may_be_fatal: bool = True,
) -> list[Action]:
    """The ``error`` event for ``error``, then a ``Close`` if it is fatal
    (the code's registry rule; ``first_config``: until a config was
    accepted).  ``may_be_fatal=False`` (a refused ``voice.*`` request) keeps
    the session open whatever the rule."""
    spec = error.code.spec
    fatal = may_be_fatal and (
        spec.fatal == "always" or (spec.fatal == "first_config" and not config_accepted)
    )
    actions: list[Action] = [
        protocol.Error(
            code=error.code,
            message=error.message,
            fatal=fatal,
            context_id=context_id,
            request_id=request_id,
            retry_after_ms=(
                None if error.retry_after_s is None else round(error.retry_after_s * 1000)
            ),
            waited_ms=None if error.waited_s is None else round(error.waited_s * 1000),
        )
    ]
    if fatal:
        actions.append(Close(spec.close_code or CloseCode.POLICY, str(error.code)))
    return actions
