"""The resume tokens of a server's sessions, and the windows of the
suspended ones (``session.resume``, protocol 2.1.0).

A token is ``secrets.token_urlsafe(32)``; only its SHA-256 is kept, and a
session is found by that hash, so the token is never compared byte by byte
nor stored or logged.  Each token is good for one resume: ``take`` removes
it, and the resumed session gets a new one (``issue``).  The token is bound
to the credential the session was opened with (a hash of its API or agent
key, ``""`` without one), compared in constant time.

A suspended session (``suspend``) is ended by its ``expire`` once
``window_s`` passes, and its hash is remembered for a while
(``EXPIRED_REMEMBERED``) so a late resume is told ``resume_expired``
rather than ``resume_invalid``.  No I/O beyond the event loop's timers.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import ErrorCode, GatewayError

#: expired tokens remembered for ``resume_expired`` (the oldest forgotten first)
EXPIRED_REMEMBERED = 10_000


class Resumable(Protocol):
    def expire(self) -> asyncio.Task[None] | None:
        """The window passed: end the session as a dropped connection ends
        (the task that finishes ending it, if any)."""
        ...

    def take_over(self) -> None:
        """A resume took the session while its connection still looked open:
        drop that connection (its reader stops)."""
        ...


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def credential_of(key: str | None) -> str:
    """What a token is bound to: a hash of the key presented, ``""`` for none."""
    return "" if key is None else hashlib.sha256(key.encode()).hexdigest()


@dataclass(eq=False)
class _Entry:
    holder: Resumable
    credential: str
    timer: asyncio.TimerHandle | None = None  #: set while suspended


class ResumeBook:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._entries: dict[str, _Entry] = {}
        self._expired: OrderedDict[str, None] = OrderedDict()
        #: sessions being ended after their window (awaited by a drain)
        self._ending: set[asyncio.Task[None]] = set()

    @property
    def suspended(self) -> int:
        return sum(1 for e in self._entries.values() if e.timer is not None)

    def suspended_holders(self) -> list[Resumable]:
        return [e.holder for e in self._entries.values() if e.timer is not None]

    def issue(self, holder: Resumable, credential: str) -> tuple[str, str]:
        """A new token for ``holder``: (the token, its hash)."""
        token = secrets.token_urlsafe(32)
        digest = token_hash(token)
        self._entries[digest] = _Entry(holder, credential)
        return token, digest

    def suspend(self, digest: str) -> None:
        entry = self._entries.get(digest)
        if entry is None:
            return
        loop = asyncio.get_running_loop()
        entry.timer = loop.call_later(self.window_s, self._expire, digest)

    def _expire(self, digest: str) -> None:
        entry = self._entries.pop(digest, None)
        if entry is None:
            return
        self._expired[digest] = None
        while len(self._expired) > EXPIRED_REMEMBERED:
            self._expired.popitem(last=False)
        ending = entry.holder.expire()
        if ending is not None:
            self._ending.add(ending)
            ending.add_done_callback(self._ending.discard)

    def forget(self, digest: str | None) -> None:
        """The session ended: its token resumes nothing any more."""
        if digest is None:
            return
        entry = self._entries.pop(digest, None)
        if entry is not None and entry.timer is not None:
            entry.timer.cancel()

    def take(self, token: str, credential: str) -> Resumable:
        """The session ``token`` resumes; its token is used up.  A token of
        another credential leaves it untouched (``resume_forbidden``)."""
        digest = token_hash(token)
        entry = self._entries.get(digest)
        if entry is None:
            if digest in self._expired:
                raise GatewayError(
                    ErrorCode.RESUME_EXPIRED,
                    f"the session was not resumed within resume_window_s ({self.window_s:g} s)"
                    " and has ended; open a new session and send its text again",
                )
            raise GatewayError(
                ErrorCode.RESUME_INVALID,
                "no session holds this resume_token (unknown, already used, or its session"
                " ended); use the token of the latest session.created, or open a new session",
            )
        if not hmac.compare_digest(entry.credential, credential):
            raise GatewayError(
                ErrorCode.RESUME_FORBIDDEN,
                "this resume_token belongs to a session opened with another key; present"
                " the key that opened it",
            )
        del self._entries[digest]
        if entry.timer is not None:
            entry.timer.cancel()
        else:
            entry.holder.take_over()
        return entry.holder

    async def end_all(self) -> None:
        """Server drain: every suspended session ends now."""
        for digest, entry in list(self._entries.items()):
            if entry.timer is not None:
                entry.timer.cancel()
                self._expire(digest)
        await asyncio.gather(*self._ending, return_exceptions=True)
