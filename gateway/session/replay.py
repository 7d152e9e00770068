"""What a session sent, held for ``session.resume``: a pure record, no I/O.

Every message sent to the client after ``session.created`` is recorded here
in the order it was written to the connection, encoded (JSON text, or the
binary message with its tagged header), so a resume sends it again byte for
byte.  Binary messages are counted per *key*: the context id under tagged
framing, ``None`` for every binary message under raw framing (a raw message
carries no context), the counting of ``session.resume``'s ``received``.

``unreceived`` finds what a client that reports ``received`` did not get.
Over one TCP connection the client got a prefix of what was sent, so it
got everything up to its last binary message in any key; everything after
that is sent again (events there may repeat, binary messages never do).

Retention: the newest ``max_bytes`` (payload bytes and event characters)
are held; older messages are dropped.  A resume that needs a dropped one is
refused (``ReplayLost``).  Only the last position of a dropped binary
message per key is kept, to place a resume that begins right after it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Sent:
    """One message as written: ``text`` (a JSON event) or ``data`` (binary)."""

    position: int  #: its place among all the session's messages, from 0
    text: str | None = None
    data: bytes | None = None
    key: str | None = None  #: binary: the key it is counted under
    number: int = -1  #: binary: its number within its key, from 0

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else len(self.text or "")


class ReplayInvalid(ValueError):
    """``received`` counts messages never sent, or an order no connection
    could have received them in."""


class ReplayLost(ValueError):
    """A message the client did not get is no longer held."""


class ReplayLog:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._held: deque[Sent] = deque()
        self._bytes = 0
        self._next = 0  #: the next message's position
        #: binary messages sent per key
        self.counts: dict[str | None, int] = {}
        #: per key, (number, position) of its newest dropped binary message
        self._dropped: dict[str | None, tuple[int, int]] = {}
        #: where the current connection's messages begin (a resume sends
        #: again from here, then the new ones follow)
        self.connection_start = 0

    @property
    def sent(self) -> int:
        """Messages recorded so far."""
        return self._next

    @property
    def held_bytes(self) -> int:
        """What the log holds now (payload bytes and event characters)."""
        return self._bytes

    @property
    def first_held(self) -> int:
        return self._held[0].position if self._held else self._next

    def event(self, text: str) -> None:
        self._append(Sent(self._next, text=text))

    def audio(self, key: str | None, data: bytes) -> None:
        number = self.counts.get(key, 0)
        self.counts[key] = number + 1
        self._append(Sent(self._next, data=data, key=key, number=number))

    def _append(self, sent: Sent) -> None:
        self._next += 1
        self._held.append(sent)
        self._bytes += sent.size
        while self._bytes > self.max_bytes and len(self._held) > 1:
            old = self._held.popleft()
            self._bytes -= old.size
            if old.data is not None:
                self._dropped[old.key] = (old.number, old.position)

    def _position(self, key: str | None, number: int) -> int | None:
        """Where binary message ``number`` of ``key`` was sent; None if dropped
        (and not the newest dropped one)."""
        for sent in self._held:
            if sent.data is not None and sent.key == key and sent.number == number:
                return sent.position
        dropped = self._dropped.get(key)
        if dropped is not None and dropped[0] == number:
            return dropped[1]
        return None

    def unreceived(
        self, received: Mapping[str | None, int], events: int | None = None
    ) -> list[Sent]:
        """The messages a client that got ``received`` binary messages per key
        (and ``events`` JSON messages on its last connection, if it says) did
        not surely get, in order.  The caller then resumes from the first of
        them (``resumed_at``)."""
        for key, count in received.items():
            if count > self.counts.get(key, 0):
                raise ReplayInvalid(
                    f"received counts {count} binary messages for context {key!r};"
                    f" {self.counts.get(key, 0)} were sent"
                )
        start = 0
        for key, count in received.items():
            if count == 0:
                continue
            position = self._position(key, count - 1)
            if position is None:
                raise ReplayLost("the audio after the last message received is no longer held")
            start = max(start, position + 1)
        if events is not None:
            start = max(start, self._after_events(events))
        if start < self.first_held:
            raise ReplayLost("the messages after the last one received are no longer held")
        for key, sent_count in self.counts.items():
            count = received.get(key, 0)
            if count < sent_count:
                position = self._position(key, count)
                if position is None or position < self.first_held:
                    raise ReplayLost("audio the client did not get is no longer held")
                if position < start:
                    raise ReplayInvalid(
                        f"received says binary message {count} of context {key!r} was not"
                        " received but a later message was"
                    )
        return [sent for sent in self._held if sent.position >= start]

    def _after_events(self, events: int) -> int:
        """The position after the ``events``-th JSON message of the current
        connection."""
        if events == 0:
            return self.connection_start
        if self.connection_start < self.first_held:
            raise ReplayLost("the events of the dropped connection are no longer held")
        seen = 0
        for sent in self._held:
            if sent.position >= self.connection_start and sent.text is not None:
                seen += 1
                if seen == events:
                    return sent.position + 1
        raise ReplayInvalid(f"received counts {events} events; {seen} were sent")

    def resumed_at(self, replay: list[Sent]) -> None:
        """A new connection begins with ``replay``, then the new messages."""
        self.connection_start = replay[0].position if replay else self._next
