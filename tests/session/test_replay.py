"""The replay log (``gateway.session.replay``): what a resume sends again,
table-tested without a server."""

from __future__ import annotations

import pytest

from gateway.session.replay import ReplayInvalid, ReplayLog, ReplayLost


def _log(*items: str, max_bytes: int = 1 << 20) -> ReplayLog:
    """``e``: an event; ``a``/``b``: a binary message of context a/b."""
    log = ReplayLog(max_bytes)
    for i, item in enumerate(items):
        if item == "e":
            log.event(f"event {i}")
        else:
            log.audio(item, bytes(10))
    return log


def _shape(log: ReplayLog, received: dict[str | None, int], events: int | None = None) -> str:
    return "".join(
        "e" if s.text is not None else str(s.key) for s in log.unreceived(received, events)
    )


@pytest.mark.parametrize(
    ("items", "received", "events", "expected"),
    [
        ("eaaae", {"a": 3}, None, "e"),  # the event after the last frame comes again
        ("eaaae", {"a": 3}, 2, ""),  # counted: nothing comes again
        ("eaaae", {"a": 1}, None, "aae"),
        ("eaaae", {}, None, "eaaae"),
        ("eaaae", {}, 1, "aaae"),
        ("eabab", {"a": 2, "b": 1}, None, "b"),
        ("eabab", {"a": 1, "b": 1}, None, "ab"),
    ],
)
def test_unreceived(
    items: str, received: dict[str | None, int], events: int | None, expected: str
) -> None:
    assert _shape(_log(*items), received, events) == expected


def test_counts_over_what_was_sent_are_invalid() -> None:
    with pytest.raises(ReplayInvalid):
        _log("a", "a").unreceived({"a": 3})
    with pytest.raises(ReplayInvalid):
        _log("e", "a").unreceived({"a": 1}, events=2)


def test_an_impossible_order_is_invalid() -> None:
    # b's second message was received but a's first, sent before it, was not
    with pytest.raises(ReplayInvalid):
        _log("a", "b", "b").unreceived({"a": 0, "b": 2})


def test_a_resume_needing_dropped_audio_is_lost() -> None:
    log = _log("a", "a", "a", "a", max_bytes=20)  # holds the newest two
    assert _shape(log, {"a": 2}) == "aa"
    with pytest.raises(ReplayLost):
        log.unreceived({"a": 1})


def test_a_resumed_connection_counts_its_events_from_the_replay() -> None:
    log = _log("e", "a", "e")
    replay = log.unreceived({"a": 1})
    log.resumed_at(replay)
    log.event("new")
    assert _shape(log, {"a": 1}, events=1) == "e"  # got the replayed event only
    assert _shape(log, {"a": 1}, events=2) == ""
