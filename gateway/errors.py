"""The error registry: one table drives the WebSocket and HTTP behaviour.

Each ``ErrorCode`` has a stable wire name, a fatality rule, the WebSocket
close code used when it is fatal, the HTTP status and the OpenAI error type.
``docs/protocol.md`` carries the same table; a test iterates this enum and
checks every row is there, so the two cannot drift.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

#: ``never``: the session goes on; ``always``: the server closes the
#: connection after the ``error`` event; ``first_config``: fatal only while no
#: ``session.config`` has been accepted yet (vllm-omni's behaviour).
Fatality = Literal["never", "always", "first_config"]


class CloseCode(enum.IntEnum):
    """WebSocket close codes the gateway uses."""

    NORMAL = 1000  #: after ``session.close``
    GOING_AWAY = 1001  #: server shutdown
    INVALID_DATA = 1007  #: invalid UTF-8 in a text frame (WebSocket layer)
    POLICY = 1008  #: auth, origin, a rejected first config
    TOO_BIG = 1009  #: a frame over the WebSocket message cap (WebSocket layer)
    INTERNAL = 1011  #: unexpected server failure
    TRY_AGAIN = 1013  #: over capacity or shutting down
    CONFIG_TIMEOUT = 4001  #: no first message within ``config_timeout_s``
    IDLE_TIMEOUT = 4002  #: nothing happened for ``idle_timeout_s``
    STALL_TIMEOUT = 4008  #: the client stopped reading for ``stall_timeout_s``


@dataclass(frozen=True)
class ErrorSpec:
    fatal: Fatality
    close_code: CloseCode | None
    http_status: int
    openai_type: str
    summary: str


#: how long a client told ``busy`` should wait before it retries (seconds):
#: HTTP's ``Retry-After``, the WebSocket ``error``'s ``retry_after_ms``
BUSY_RETRY_AFTER_S = 1


class ErrorCode(enum.StrEnum):
    INVALID_JSON = "invalid_json"
    INVALID_MESSAGE = "invalid_message"
    UNKNOWN_TYPE = "unknown_type"
    INVALID_CONFIG = "invalid_config"
    UNKNOWN_VOICE = "unknown_voice"
    UNSUPPORTED_OPTION = "unsupported_option"
    INVALID_STATE = "invalid_state"
    TEXT_TOO_LONG = "text_too_long"
    MESSAGE_TOO_LARGE = "message_too_large"
    UNAUTHORIZED = "unauthorized"
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"
    HOST_NOT_ALLOWED = "host_not_allowed"
    BUSY = "busy"
    RATE_LIMITED = "rate_limited"
    TIMEOUT = "timeout"
    LISTENER_SILENT = "listener_silent"
    ENGINE_REFUSED = "engine_refused"
    INVALID_SSML = "invalid_ssml"
    NOT_FOUND = "not_found"
    INTERNAL = "internal"
    RESUME_INVALID = "resume_invalid"
    RESUME_EXPIRED = "resume_expired"
    RESUME_FORBIDDEN = "resume_forbidden"
    RESUME_ELSEWHERE = "resume_elsewhere"

    @property
    def spec(self) -> ErrorSpec:
        return _SPECS[self]


_BAD = "invalid_request_error"
_SPECS: dict[ErrorCode, ErrorSpec] = {
    ErrorCode.INVALID_JSON: ErrorSpec("never", None, 400, _BAD, "A text frame is not valid JSON."),
    ErrorCode.INVALID_MESSAGE: ErrorSpec(
        "never",
        None,
        400,
        _BAD,
        "JSON that is not an object, lacks `type`, or has a field of the wrong type.",
    ),
    ErrorCode.UNKNOWN_TYPE: ErrorSpec("never", None, 400, _BAD, "`type` names no message."),
    ErrorCode.INVALID_CONFIG: ErrorSpec(
        "first_config",
        CloseCode.POLICY,
        400,
        _BAD,
        "A `session.config` field is unknown, malformed or out of range.",
    ),
    # never fatal, even in the first config: other servers' example clients
    # send their own preset names (vllm-omni's "Vivian"); refusing the config
    # and going on with the previous one lets them speak and print the error
    ErrorCode.UNKNOWN_VOICE: ErrorSpec(
        "never",
        None,
        400,
        _BAD,
        "The voice is not installed; the message lists the available voices.",
    ),
    ErrorCode.UNSUPPORTED_OPTION: ErrorSpec(
        "first_config",
        CloseCode.POLICY,
        400,
        _BAD,
        "A known option has a value this engine cannot honour.",
    ),
    ErrorCode.INVALID_STATE: ErrorSpec(
        "never", None, 409, _BAD, "The message is not allowed in the current state."
    ),
    ErrorCode.TEXT_TOO_LONG: ErrorSpec(
        "never", None, 400, _BAD, "Text over the per-message or per-utterance limit."
    ),
    ErrorCode.MESSAGE_TOO_LARGE: ErrorSpec(
        "never", None, 413, _BAD, "A message, request body or form over its size or part limit."
    ),
    ErrorCode.UNAUTHORIZED: ErrorSpec(
        "always", CloseCode.POLICY, 401, "authentication_error", "Missing or wrong API key."
    ),
    ErrorCode.ORIGIN_NOT_ALLOWED: ErrorSpec(
        "always", CloseCode.POLICY, 403, "permission_error", "The page's Origin is not allowed."
    ),
    ErrorCode.HOST_NOT_ALLOWED: ErrorSpec(
        "always",
        CloseCode.POLICY,
        403,
        "permission_error",
        "The request's Host is not a name of this server (DNS rebinding defence).",
    ),
    ErrorCode.BUSY: ErrorSpec(
        "never",
        CloseCode.TRY_AGAIN,
        503,
        "server_error",
        "The server is at capacity (or draining); the utterance or session was refused."
        " A refused utterance carries `retry_after_ms`, an HTTP response `Retry-After`.",
    ),
    ErrorCode.RATE_LIMITED: ErrorSpec(
        "never",
        None,
        429,
        "rate_limit_error",
        "Too many messages, connections or HTTP requests; dropped.",
    ),
    ErrorCode.TIMEOUT: ErrorSpec(
        "always",
        CloseCode.IDLE_TIMEOUT,
        408,
        _BAD,
        "A config, idle or stall timeout expired (close 4001, 4002 or 4008).",
    ),
    ErrorCode.LISTENER_SILENT: ErrorSpec(
        "never",
        None,
        408,
        _BAD,
        'Under `flow_control: "ack"` audio waited `ack_timeout_s` on a closed window with no'
        " `playback` report: the utterance was cancelled (and reported) and its slot released.",
    ),
    ErrorCode.ENGINE_REFUSED: ErrorSpec(
        "never",
        None,
        400,
        _BAD,
        "The engine (an upstream server) refused the request as invalid; its reason is in"
        " the message.",
    ),
    ErrorCode.INVALID_SSML: ErrorSpec(
        "never",
        None,
        400,
        _BAD,
        "The text is malformed SSML (`input_format: ssml`); the message names the character"
        " position. What came before it is spoken.",
    ),
    # HTTP only: vllm-omni 0.30 answers 404 for a voice nobody uploaded; the
    # WebSocket's ``voice.remove`` keeps ``unknown_voice``
    ErrorCode.NOT_FOUND: ErrorSpec(
        "never",
        None,
        404,
        _BAD,
        "HTTP only: the named resource does not exist (deleting a voice nobody uploaded).",
    ),
    ErrorCode.INTERNAL: ErrorSpec(
        "never",
        CloseCode.INTERNAL,
        500,
        "server_error",
        "The server failed; a failed sentence ends with `audio.done` `error: true`.",
    ),
    ErrorCode.RESUME_INVALID: ErrorSpec(
        "always",
        CloseCode.POLICY,
        400,
        _BAD,
        "`session.resume` with a token no session holds (unknown, already used, or its"
        " session ended), out of place, or counting audio never sent.",
    ),
    ErrorCode.RESUME_EXPIRED: ErrorSpec(
        "always",
        CloseCode.POLICY,
        410,
        _BAD,
        "`session.resume` after `resume_window_s`, or asking for audio no longer held.",
    ),
    ErrorCode.RESUME_FORBIDDEN: ErrorSpec(
        "always",
        CloseCode.POLICY,
        403,
        "permission_error",
        "`session.resume` with a token of a session opened with another API or agent key.",
    ),
    # 421 Misdirected Request: the request went to a server that cannot answer it
    ErrorCode.RESUME_ELSEWHERE: ErrorSpec(
        "always",
        CloseCode.POLICY,
        421,
        _BAD,
        "`session.resume` with a token another gateway issued; the message names that"
        " gateway's id (route by the token's prefix).",
    ),
}


class GatewayError(Exception):
    """An error with a registry code and a message a person can act on."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        param: str | None = None,
        retry_after_s: float | None = None,
        waited_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        #: a ``busy`` refusal's retry advice (``retry_after_ms``, ``Retry-After``)
        self.retry_after_s = retry_after_s
        #: a ``busy`` refusal that came after waiting in the admission queue:
        #: how long it waited (``waited_ms``)
        self.waited_s = waited_s


class SettingsError(ValueError):
    """A setting is missing, malformed or out of range (raised at start, by
    ``gateway.settings`` and by the engines' sections; ``serve`` stops with
    exit code 2 and the message)."""
