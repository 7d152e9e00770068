"""The resume tokens of a server's sessions, and the windows of the
suspended ones (``session.resume``, protocol 2.1.0; limits, the gateway's
prefix and the report of what was not heard since 2.2.0).

A token is ``<gateway id>.<secrets.token_urlsafe(32)>``: the prefix names
the gateway that issued it (so a proxy can route a resume to it, and a
gateway that did not issue it says where to go: ``resume_elsewhere``); the
secret part is what makes it unguessable.  Only the token's SHA-256 is
kept, and a session is found by that hash, so the token is never compared
byte by byte nor stored or logged.  Each token is good for one resume:
``take`` removes it, and the resumed session gets a new one (``issue``).
The token is bound to the credential the session was opened with (a hash
of its API or agent key, ``""`` without one), compared in constant time.

A suspended session (``suspend``) is ended by its ``expire`` once
``window_s`` passes, or earlier to make room under the suspended sessions'
limits (``SuspendLimits``: the oldest suspended session ends first, of the
client for the per-client limit, of the server for the others).  Its hash
is remembered for a while (``EXPIRED_REMEMBERED``) so a late resume is told
``resume_expired`` rather than ``resume_invalid``, and for ``report_s``
that error carries the text the client sent and did not hear
(``Resumable.unheard``), once, bounded (``REPORT_CHARS``,
``REPORTS_HELD_CHARS``).  No I/O beyond the event loop's timers.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import socket
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway import protocol
from gateway.errors import ErrorCode, GatewayError
from gateway.settings import GATEWAY_ID

#: expired tokens remembered for ``resume_expired`` (the oldest forgotten first)
EXPIRED_REMEMBERED = 10_000
#: the most characters of unheard text one report carries (all its contexts)
REPORT_CHARS = 16_384
#: the most characters of unheard text held for reports, all sessions
#: together (the oldest reports are dropped first; their tokens still get
#: ``resume_expired``, without the text)
REPORTS_HELD_CHARS = 4 * 1024 * 1024


def default_gateway_id() -> str:
    """The host name, cut to what a gateway id may be (a Kubernetes pod's
    name, a StatefulSet's ``voice-gateway-0``)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])[:64]
    return name or "gateway"


class Resumable(Protocol):
    def expire(self) -> asyncio.Task[None] | None:
        """The window passed: end the session as a dropped connection ends
        (the task that finishes ending it, if any)."""
        ...

    def take_over(self) -> None:
        """A resume took the session while its connection still looked open:
        drop that connection (its reader stops)."""
        ...

    def unheard(self) -> list[protocol.UnspokenText]:
        """Per context, the text the client sent and did not hear (before
        ``expire``)."""
        ...


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def credential_of(key: str | None) -> str:
    """What a token is bound to: a hash of the key presented, ``""`` for none."""
    return "" if key is None else hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class SuspendLimits:
    """Caps on suspended sessions (settings ``max_suspended_*``)."""

    sessions: int = 64  #: on the server
    per_client: int = 64  #: per client (address or agent key)
    retained_bytes: int = 64 * 1024 * 1024  #: their replay logs, all together


@dataclass(eq=False)
class _Entry:
    holder: Resumable
    credential: str
    timer: asyncio.TimerHandle | None = None  #: set while suspended
    client: str = ""  #: set while suspended: whose limit it counts in
    retained: int = 0  #: set while suspended: its replay log's bytes


@dataclass(eq=False)
class _Expired:
    credential: str
    why: str  #: the message of its ``resume_expired``
    report: list[protocol.UnspokenText] | None = None  #: given once, until ``report_until``
    report_until: float = 0.0
    chars: int = 0


class ResumeExpired(GatewayError):
    """``resume_expired``, with the unheard text when it is still held."""

    def __init__(self, message: str, unspoken: list[protocol.UnspokenText] | None) -> None:
        super().__init__(ErrorCode.RESUME_EXPIRED, message)
        self.unspoken = unspoken


def bounded_report(
    unheard: list[protocol.UnspokenText], limit: int = REPORT_CHARS
) -> list[protocol.UnspokenText]:
    """``unheard`` cut to ``limit`` characters in all: each context keeps the
    beginning of its text (``truncated`` when cut), in order."""
    out: list[protocol.UnspokenText] = []
    left = limit
    for item in unheard:
        text = item.unspoken_text[:left]
        cut = item.truncated or len(text) < len(item.unspoken_text)
        out.append(
            protocol.UnspokenText(context_id=item.context_id, unspoken_text=text, truncated=cut)
        )
        left -= len(text)
    return out


class ResumeBook:
    def __init__(
        self,
        window_s: float,
        *,
        gateway_id: str = "gateway",
        limits: SuspendLimits | None = None,
        report_s: float = 0.0,
    ) -> None:
        assert GATEWAY_ID.fullmatch(gateway_id), gateway_id
        self.window_s = window_s
        self.gateway_id = gateway_id
        self.limits = limits or SuspendLimits()
        self.report_s = report_s
        self._entries: dict[str, _Entry] = {}
        #: the suspended sessions' hashes, oldest suspended first
        self._suspended: OrderedDict[str, _Entry] = OrderedDict()
        self._suspended_by_client: dict[str, int] = {}
        #: their replay logs' bytes, all together
        self.retained_bytes = 0
        self._expired: OrderedDict[str, _Expired] = OrderedDict()
        self._report_chars = 0
        #: sessions being ended after their window (awaited by a drain)
        self._ending: set[asyncio.Task[None]] = set()
        #: told the limit's name when a suspended session ends to make room
        self.on_evicted: Callable[[str], None] = lambda limit: None

    @property
    def suspended(self) -> int:
        return len(self._suspended)

    def suspended_holders(self) -> list[Resumable]:
        return [e.holder for e in self._suspended.values()]

    def issue(self, holder: Resumable, credential: str) -> tuple[str, str]:
        """A new token for ``holder``: (the token, its hash)."""
        token = f"{self.gateway_id}.{secrets.token_urlsafe(32)}"
        digest = token_hash(token)
        self._entries[digest] = _Entry(holder, credential)
        return token, digest

    # --- suspended sessions -----------------------------------------------------
    def suspend(self, digest: str, client: str = "", retained: int = 0) -> None:
        """The session of ``digest`` waits ``window_s`` for a resume; older
        suspended sessions end first if the limits need the room."""
        entry = self._entries.get(digest)
        if entry is None or entry.timer is not None:
            return
        self._make_room(client, retained)
        loop = asyncio.get_running_loop()
        entry.timer = loop.call_later(self.window_s, self._expire, digest)
        entry.client, entry.retained = client, retained
        self._suspended[digest] = entry
        self._suspended_by_client[client] = self._suspended_by_client.get(client, 0) + 1
        self.retained_bytes += retained

    def _make_room(self, client: str, retained: int) -> None:
        limits = self.limits
        while self._suspended_by_client.get(client, 0) >= limits.per_client:
            oldest = next(d for d, e in self._suspended.items() if e.client == client)
            self._evict(oldest, "max_suspended_sessions_per_client")
        while self._suspended and len(self._suspended) >= limits.sessions:
            self._evict(next(iter(self._suspended)), "max_suspended_sessions")
        while self._suspended and self.retained_bytes + retained > limits.retained_bytes:
            self._evict(next(iter(self._suspended)), "max_suspended_bytes")

    def _evict(self, digest: str, limit: str) -> None:
        self.on_evicted(limit)
        self._expire(
            digest,
            f"the session was ended before its resume_window_s to make room for a newer"
            f" suspended session ({limit})",
        )

    def _unsuspend(self, digest: str) -> _Entry | None:
        entry = self._suspended.pop(digest, None)
        if entry is None:
            return None
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        left = self._suspended_by_client[entry.client] - 1
        if left:
            self._suspended_by_client[entry.client] = left
        else:
            del self._suspended_by_client[entry.client]
        self.retained_bytes -= entry.retained
        return entry

    def _expire(self, digest: str, why: str | None = None) -> None:
        self._unsuspend(digest)
        entry = self._entries.pop(digest, None)
        if entry is None:
            return
        expired = _Expired(
            entry.credential,
            why
            or f"the session was not resumed within resume_window_s ({self.window_s:g} s)"
            " and has ended",
        )
        if self.report_s > 0:
            self._hold_report(expired, entry.holder.unheard())
        self._expired[digest] = expired
        while len(self._expired) > EXPIRED_REMEMBERED:
            self._drop_report(self._expired.popitem(last=False)[1])
        ending = entry.holder.expire()
        if ending is not None:
            self._ending.add(ending)
            ending.add_done_callback(self._ending.discard)

    # --- reports of what was not heard --------------------------------------------
    def _hold_report(self, expired: _Expired, unheard: list[protocol.UnspokenText]) -> None:
        report = bounded_report(unheard)
        expired.chars = sum(len(item.unspoken_text) for item in report)
        expired.report = report
        expired.report_until = asyncio.get_running_loop().time() + self.report_s
        self._report_chars += expired.chars
        for old in self._expired.values():  # the oldest reports go first
            if self._report_chars <= REPORTS_HELD_CHARS:
                break
            self._drop_report(old)

    def _drop_report(self, expired: _Expired) -> None:
        if expired.report is not None:
            self._report_chars -= expired.chars
            expired.report = None

    def _expired_error(self, expired: _Expired) -> ResumeExpired:
        report = expired.report
        if report is not None and asyncio.get_running_loop().time() > expired.report_until:
            report = None
        self._drop_report(expired)  # given once
        said = (
            "; unspoken holds the text it had not spoken, to send again on a new session"
            if report is not None
            else ""
        )
        return ResumeExpired(f"{expired.why}{said}; open a new session", report)

    # --- resuming ----------------------------------------------------------------
    def forget(self, digest: str | None) -> None:
        """The session ended: its token resumes nothing any more."""
        if digest is None:
            return
        self._unsuspend(digest)
        self._entries.pop(digest, None)

    def check_issuer(self, token: str) -> None:
        """``resume_elsewhere`` for a token whose prefix names another gateway."""
        issuer, dot, _ = token.rpartition(".")
        if dot and issuer != self.gateway_id and GATEWAY_ID.fullmatch(issuer):
            raise GatewayError(
                ErrorCode.RESUME_ELSEWHERE,
                f"this resume_token was issued by gateway {issuer!r}, not by this one"
                f" ({self.gateway_id!r}); resume on gateway {issuer!r}: route the"
                " connection by the token's prefix (docs/deployment.md)",
            )

    def take(self, token: str, credential: str) -> Resumable:
        """The session ``token`` resumes; its token is used up.  A token of
        another credential leaves it untouched (``resume_forbidden``)."""
        self.check_issuer(token)
        digest = token_hash(token)
        entry = self._entries.get(digest)
        if entry is None:
            expired = self._expired.get(digest)
            if expired is not None:
                if not hmac.compare_digest(expired.credential, credential):
                    raise _forbidden()
                raise self._expired_error(expired)
            raise GatewayError(
                ErrorCode.RESUME_INVALID,
                "no session holds this resume_token (unknown, already used, or its session"
                " ended); use the token of the latest session.created, or open a new session",
            )
        if not hmac.compare_digest(entry.credential, credential):
            raise _forbidden()
        del self._entries[digest]
        if self._unsuspend(digest) is None:
            entry.holder.take_over()
        return entry.holder

    def end(self, holder: Resumable, why: str) -> ResumeExpired:
        """A resume that ``take`` gave was refused in a way that ends the
        session (what it must send again is gone): end it now; the error,
        with the report."""
        unheard = bounded_report(holder.unheard())
        ending = holder.expire()
        if ending is not None:
            self._ending.add(ending)
            ending.add_done_callback(self._ending.discard)
        return ResumeExpired(why, unheard if self.report_s > 0 else None)

    async def end_all(self) -> None:
        """Server drain: every suspended session ends now."""
        for digest in list(self._suspended):
            self._expire(digest, "the server is shutting down; the session has ended")
        await asyncio.gather(*self._ending, return_exceptions=True)


def _forbidden() -> GatewayError:
    return GatewayError(
        ErrorCode.RESUME_FORBIDDEN,
        "this resume_token belongs to a session opened with another key; present"
        " the key that opened it",
    )
