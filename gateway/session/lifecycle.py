"""A session's lifecycle: ``OPEN`` (after ``session.created``) ->
``CLOSING`` (close, error or disconnect: work is being cancelled) ->
``CLOSED``.  An illegal transition raises at once instead of limping on."""

from __future__ import annotations

import enum


class State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_ALLOWED = {
    State.OPEN: {State.CLOSING, State.CLOSED},
    State.CLOSING: {State.CLOSED},
    State.CLOSED: set(),
}


def transition(current: State, new: State) -> State:
    """``new``, if a session in ``current`` may go there; else ``RuntimeError``."""
    if new not in _ALLOWED[current]:
        raise RuntimeError(f"illegal session transition {current} -> {new}")
    return new
