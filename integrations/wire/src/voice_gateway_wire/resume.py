"""A client's resume bookkeeping (``session.resume``, protocol 2.1.0).

Pure, no I/O: the gateway's Python client (``gateway.client``) and the
Pipecat and LiveKit plugins feed a ``ResumeTracker`` what they send and
receive, and ask it whether a closed connection may be resumed, for the
``session.resume`` to send, and for the text to send again after the
``session.resumed`` answer.  The reference is the gateway's
``docs/protocol.md`` (``session.resume``, ``session.resumed``).

What it counts:

- binary messages received per context (under ``raw`` framing every one
  under ``None``), over the whole session: ``received``;
- JSON messages received on the current connection after its
  ``session.created`` (after ``session.resumed`` on a resumed one):
  ``events``, so the server sends again exactly what was not received;
- per context, the text of every utterance without its ``session.done``
  (``TextLedger``): how much of it went out on a connection, whether its
  ``input.done`` did, and whether it was cancelled.

The text to send again: the server reports, per live context, the
characters of its open utterance (``text_chars``).  Over one TCP
connection it got a prefix of what was sent, so the ledger finds where
that prefix ends: the latest point of what was sent where the open
utterance holds exactly that many characters.  Each ``session.done``
removes its utterance, so the answer is read after the messages sent again
(``replayed_messages``): a context the server no longer lists got nothing
of the utterances still in the ledger, and all of them go again.  One case
stays ambiguous, two ``input.done`` of one context lost in the same drop
with the utterance between them as long as what the server holds; the
ledger then takes the later reading (less is sent twice).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: close codes of a dropped connection: no close frame (1005, 1006) or a
#: proxy or server restarting (1012-1014).  The server suspends the session;
#: any other close (the client's own 1000, a fatal error's 1008) ends it.
DROP_CLOSE_CODES: Final = frozenset({1005, 1006, 1012, 1013, 1014})
#: ``session.resume`` refusals: the session cannot be taken back, stop trying
#: (``resume_elsewhere``: the try carried the gateway id for the proxy and
#: still reached another gateway)
RESUME_REFUSALS: Final = frozenset(
    {"resume_invalid", "resume_expired", "resume_forbidden", "resume_elsewhere"}
)


def resume_url(url: str, token: str | None) -> str:
    """``url`` with ``resume=<the gateway id>`` (the token's prefix, protocol
    2.2.0), for a proxy to route the resume to the gateway that issued the
    token (the gateway's docs/deployment.md); the token itself stays out of
    the URL.  ``url`` as it is for a token that names no gateway (2.1.0)."""
    issuer, dot, _ = (token or "").rpartition(".")
    if not dot:
        return url
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "resume"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("resume", issuer)])))


#: the longest wait between two tries to reconnect (a server restarting)
MAX_RETRY_DELAY_S: Final = 2.0
#: the first wait after the immediate first try
FIRST_RETRY_DELAY_S: Final = 0.1
#: tries stop this long before the window ends, so the last one can still
#: be answered inside it
WINDOW_MARGIN_S: Final = 0.5


def is_drop(close_code: int | None) -> bool:
    """Whether a connection that closed with ``close_code`` (None: none was
    received) left its session suspended on the server."""
    return close_code is None or close_code in DROP_CLOSE_CODES


def retry_delay_s(attempt: int) -> float:
    """How long to wait before try ``attempt`` (0 is the first: at once)."""
    if attempt <= 0:
        return 0.0
    return float(min(MAX_RETRY_DELAY_S, FIRST_RETRY_DELAY_S * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class Resumed:
    """What ``session.resumed`` says."""

    #: per live context, the characters of its open utterance the server holds
    held: dict[str | None, int]
    #: per live context, the sequence number of its next binary message
    next_sequence: dict[str | None, int]
    #: messages sent again right after ``session.resumed``
    replayed_messages: int

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> Resumed:
        """Read a decoded ``session.resumed``; ValueError when it is not one."""
        if message.get("type") != "session.resumed":
            raise ValueError(f"expected session.resumed, got {message.get('type')!r}")
        held: dict[str | None, int] = {}
        sequences: dict[str | None, int] = {}
        for entry in message.get("contexts") or []:
            cid = entry.get("context_id")
            held[cid] = int(entry.get("text_chars", 0))
            sequences[cid] = int(entry.get("next_sequence", 0))
        return cls(held, sequences, int(message.get("replayed_messages", 0)))


@dataclass
class _Utterance:
    text: str = ""
    #: characters of ``text`` written to a connection (the rest was given
    #: while no connection was up)
    sent_chars: int = 0
    #: ``input.done`` was given / written to a connection
    done: bool = False
    done_sent: bool = False
    #: ended by ``cancel``: never sent again, never reported unspoken
    cancelled: bool = False

    @property
    def open(self) -> bool:
        return not (self.done or self.cancelled)

    @property
    def fully_sent(self) -> bool:
        """Every message of it reached a connection, ``input.done`` included."""
        return self.done_sent and self.sent_chars == len(self.text)


@dataclass
class TextLedger:
    """Per context, the utterances not finished (no ``session.done`` yet), in
    order; bounded by what the server holds (``max_utterance_chars``, its
    contexts), since each ``session.done`` removes one."""

    contexts: dict[str | None, list[_Utterance]] = field(default_factory=dict)

    def _open(self, cid: str | None) -> _Utterance:
        utterances = self.contexts.setdefault(cid, [])
        if not utterances or not utterances[-1].open:
            utterances.append(_Utterance())
        return utterances[-1]

    def text(self, cid: str | None, text: str, *, sent: bool) -> None:
        """An ``input.text``: written to a connection (``sent``) or given while
        none was up (it goes out after the resume)."""
        utterance = self._open(cid)
        utterance.text += text
        if sent:
            utterance.sent_chars = len(utterance.text)

    def done(self, cid: str | None, *, sent: bool) -> None:
        """An ``input.done`` (an empty one still makes an utterance)."""
        utterance = self._open(cid)
        utterance.done = True
        utterance.done_sent = sent
        if sent:
            utterance.sent_chars = len(utterance.text)

    def cancel(self, cid: str | None) -> None:
        """A ``cancel`` (``"*"``: every context): nothing of it is sent again."""
        for key, utterances in self.contexts.items():
            if cid == "*" or key == cid:
                for utterance in utterances:
                    utterance.cancelled = True

    def finished(self, cid: str | None) -> None:
        """A ``session.done``: the context's oldest utterance has ended."""
        utterances = self.contexts.get(cid)
        if utterances:
            utterances.pop(0)
            if not utterances:
                del self.contexts[cid]

    def unfinished(self) -> dict[str | None, str]:
        """Per context, the text of the utterances without ``session.done``
        (cancelled ones aside): what a lost session did not surely speak."""
        out: dict[str | None, str] = {}
        for cid, utterances in self.contexts.items():
            text = "".join(u.text for u in utterances if not u.cancelled)
            if text:
                out[cid] = text
        return out

    def clear(self) -> None:
        self.contexts.clear()

    def resend(self, held: Mapping[str | None, int]) -> list[dict[str, Any]]:
        """The ``input.text`` / ``input.done`` messages that give the server
        what it does not hold, given ``held`` (``Resumed.held``, read after
        the messages sent again); everything is counted as sent from here."""
        messages: list[dict[str, Any]] = []
        for cid, utterances in self.contexts.items():
            live = [u for u in utterances if not u.cancelled]
            start, offset = _received_up_to(live, held.get(cid)) if live else (0, 0)
            for index in range(start, len(live)):
                utterance = live[index]
                rest = utterance.text[offset if index == start else 0 :]
                if rest:
                    messages.append({"type": "input.text", "text": rest, "context_id": cid})
                if utterance.done:
                    messages.append({"type": "input.done", "context_id": cid})
            for utterance in live:
                utterance.sent_chars = len(utterance.text)
                utterance.done_sent = utterance.done
        return messages

    def unsent(self) -> list[dict[str, Any]]:
        """The text and ``input.done`` given and not yet sent, in order per
        context (given while the messages of ``resend`` went out); counted as
        sent from here."""
        messages: list[dict[str, Any]] = []
        for cid, utterances in self.contexts.items():
            for utterance in utterances:
                if utterance.cancelled:
                    continue
                rest = utterance.text[utterance.sent_chars :]
                if rest:
                    messages.append({"type": "input.text", "text": rest, "context_id": cid})
                if utterance.done and not utterance.done_sent:
                    messages.append({"type": "input.done", "context_id": cid})
                utterance.sent_chars = len(utterance.text)
                utterance.done_sent = utterance.done
        return messages


def _received_up_to(live: list[_Utterance], held: int | None) -> tuple[int, int]:
    """Where what the server got of ``live`` ends: (utterance, characters of
    it).  ``held`` None: the context is not live on the server, so it got none
    of them (the ``session.done`` of those it had were read before)."""
    if held is None:
        return 0, 0
    best: tuple[int, int] | None = None
    for index, utterance in enumerate(live):
        if held <= utterance.sent_chars:
            best = (index, held)
        if not utterance.fully_sent:
            break
    else:
        if held == 0:
            best = (len(live), 0)
    if best is not None:
        return best
    # the server holds more than was sent (a cancel lost in the drop): send
    # nothing again of what was sent
    for index, utterance in enumerate(live):
        if not utterance.fully_sent:
            return index, utterance.sent_chars
    return len(live), 0


class ResumeTracker:
    """A client's resume state for one session: its token, what it received,
    the text it gave.  Feed it every message; ask ``can_resume`` when the
    connection closes, send ``resume_message()``, read the answer with
    ``resumed`` and, after ``replayed_messages`` more, ``resend``."""

    def __init__(self, *, tagged: bool = True) -> None:
        #: ``framing: "tagged"``: binary messages are counted per context
        self.tagged = tagged
        self.token: str | None = None
        self.window_s = 0.0
        #: binary messages received per context over the session
        self.received: dict[str | None, int] = {}
        #: JSON messages received since this connection's created/resumed
        self.events = 0
        self.ledger = TextLedger()
        #: tagged context number -> context id (``audio.start``)
        self._numbers: dict[int, str | None] = {}
        #: a fatal ``error`` was received: the server ends the session
        self.fatal = False

    # --- the session --------------------------------------------------------
    def created(self, token: str | None, window_s: float | None) -> None:
        """A ``session.created``: its (new) token; events count from here."""
        self.token = token
        self.window_s = float(window_s or 0.0)
        self.events = 0
        self.fatal = False

    def created_message(self, created: Mapping[str, Any]) -> None:
        self.created(created.get("resume_token"), created.get("resume_window_s"))

    def new_session(self) -> None:
        """A new session (not a resume): nothing carries over."""
        self.token = None
        self.window_s = 0.0
        self.received = {}
        self.events = 0
        self.ledger.clear()
        self._numbers.clear()
        self.fatal = False

    def can_resume(self, close_code: int | None) -> bool:
        """Whether a connection closed with ``close_code`` may be resumed."""
        return (
            self.token is not None and self.window_s > 0 and not self.fatal and is_drop(close_code)
        )

    def resume_message(self) -> dict[str, Any]:
        """The ``session.resume`` that takes the session back."""
        if self.token is None:
            raise ValueError("this session has no resume_token (the server does not resume)")
        return {
            "type": "session.resume",
            "resume_token": self.token,
            "received": [{"context_id": c, "messages": n} for c, n in self.received.items()],
            "events": self.events,
        }

    def resumed(self, message: Mapping[str, Any]) -> Resumed:
        """The ``session.resumed`` (after the new ``session.created``)."""
        answer = Resumed.from_message(message)
        self.events = 0
        return answer

    def resend(self, resumed: Resumed) -> list[dict[str, Any]]:
        """After the ``replayed_messages``: what to send again, in order."""
        return self.ledger.resend(resumed.held)

    # --- receiving ----------------------------------------------------------
    def event(
        self,
        kind: str | None,
        context_id: str | None = None,
        *,
        context_number: int | None = None,
        fatal: bool = False,
    ) -> None:
        """A JSON message received (any type)."""
        self.events += 1
        if kind == "audio.start" and context_number is not None:
            self._numbers[context_number] = context_id
        elif kind == "session.done":
            self.ledger.finished(context_id)
        elif kind == "error" and fatal:
            self.fatal = True

    def event_message(self, event: Mapping[str, Any]) -> None:
        """``event`` for a decoded JSON message."""
        number = event.get("context_number")
        self.event(
            event.get("type"),
            event.get("context_id"),
            context_number=number if isinstance(number, int) else None,
            fatal=bool(event.get("fatal")),
        )

    def binary(self, context_number: int | None = None) -> str | None:
        """A binary message received: under tagged framing its header's
        context number; returns its context id (None when unknown or raw)."""
        if not self.tagged:
            self.received[None] = self.received.get(None, 0) + 1
            return None
        if context_number is None or context_number not in self._numbers:
            return None  # no audio.start announced it: outside the protocol
        cid = self._numbers[context_number]
        self.received[cid] = self.received.get(cid, 0) + 1
        return cid

    # --- sending ------------------------------------------------------------
    def text(self, context_id: str | None, text: str, *, sent: bool = True) -> None:
        self.ledger.text(context_id, text, sent=sent)

    def done(self, context_id: str | None, *, sent: bool = True) -> None:
        self.ledger.done(context_id, sent=sent)

    def cancel(self, context_id: str | None) -> None:
        self.ledger.cancel(context_id)

    def unfinished(self) -> dict[str | None, str]:
        return self.ledger.unfinished()
