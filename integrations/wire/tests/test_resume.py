"""The resume bookkeeping: counts, the ``session.resume`` it builds, and the
text it sends again for each cut point a dropped connection can have."""

from __future__ import annotations

from typing import Any

import pytest

from voice_gateway_wire.resume import (
    MAX_RETRY_DELAY_S,
    Resumed,
    ResumeTracker,
    TextLedger,
    is_drop,
    resume_url,
    retry_delay_s,
)


@pytest.mark.parametrize(
    ("url", "token", "expected"),
    [
        (
            "ws://h:8000/v1/audio/speech/stream",
            "gw-a.abcDEF_1",
            "ws://h:8000/v1/audio/speech/stream?resume=gw-a",
        ),
        ("wss://h/s?x=1&resume=old", "gw-b.abc", "wss://h/s?x=1&resume=gw-b"),
        ("ws://h/s", "nodot", "ws://h/s"),  # a 2.1.0 server's token names no gateway
        ("ws://h/s", None, "ws://h/s"),
    ],
)
def test_a_resume_url_names_the_tokens_gateway_never_the_token(
    url: str, token: str | None, expected: str
) -> None:
    assert resume_url(url, token) == expected


@pytest.mark.parametrize(
    ("code", "drop"),
    [
        *[(code, True) for code in (None, 1005, 1006, 1012, 1013, 1014)],
        *[(code, False) for code in (1000, 1001, 1008, 1011, 4002)],
    ],
)
def test_only_a_drop_may_be_resumed(code: int | None, drop: bool) -> None:
    assert is_drop(code) is drop
    tracker = ResumeTracker()
    tracker.created("token", 30.0)
    assert tracker.can_resume(code) is drop


def test_no_token_or_a_fatal_error_never_resumes() -> None:
    tracker = ResumeTracker()
    tracker.created(None, None)  # a server with resume_window_s 0
    assert not tracker.can_resume(1006)
    tracker.created("token", 30.0)
    tracker.event("error", None, fatal=True)
    assert not tracker.can_resume(1006)


def test_retry_delays_start_at_once_and_are_bounded() -> None:
    delays = [retry_delay_s(n) for n in range(12)]
    assert delays[0] == 0 and delays[1] > 0
    assert delays == sorted(delays) and max(delays) == MAX_RETRY_DELAY_S


def test_counts_binary_per_context_and_events_per_connection() -> None:
    tracker = ResumeTracker()
    tracker.created("one", 30.0)
    tracker.event("session.updated")
    tracker.event("audio.start", "a", context_number=0)
    tracker.event("audio.start", "b", context_number=1)
    for number in (0, 1, 0, 0):
        tracker.binary(number)
    assert tracker.binary(7) is None  # never announced: not counted
    assert tracker.resume_message() == {
        "type": "session.resume",
        "resume_token": "one",
        "received": [{"context_id": "a", "messages": 3}, {"context_id": "b", "messages": 1}],
        "events": 3,
    }
    # the resumed connection: a new token; events count again from its
    # session.resumed, binary messages over the whole session
    tracker.created("two", 30.0)
    answer = tracker.resumed(
        {
            "type": "session.resumed",
            "session_id": "s",
            "contexts": [{"context_id": "a", "text_chars": 0, "next_sequence": 3}],
            "replayed_messages": 2,
        }
    )
    assert answer == Resumed({"a": 0}, {"a": 3}, 2)
    tracker.binary(0)
    message = tracker.resume_message()
    assert message["resume_token"] == "two" and message["events"] == 0
    assert message["received"][0] == {"context_id": "a", "messages": 4}


def test_raw_framing_counts_every_binary_message_under_null() -> None:
    tracker = ResumeTracker(tagged=False)
    tracker.created("t", 30.0)
    tracker.binary()
    tracker.binary()
    assert tracker.resume_message()["received"] == [{"context_id": None, "messages": 2}]


def test_not_a_session_resumed_is_refused() -> None:
    with pytest.raises(ValueError, match=r"session\.resumed"):
        Resumed.from_message({"type": "error"})


def _texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["text"] if m["type"] == "input.text" else "DONE" for m in messages]


def test_an_open_utterance_sends_only_what_the_server_lacks() -> None:
    ledger = TextLedger()
    ledger.text(None, "Hello ", sent=True)
    ledger.text(None, "there ", sent=True)
    ledger.text(None, "friend.", sent=False)  # given while disconnected
    ledger.done(None, sent=False)
    assert _texts(ledger.resend({None: 6})) == ["there friend.", "DONE"]
    # all is sent now: a second drop with everything held sends nothing
    assert ledger.resend({None: 0}) == []


@pytest.mark.parametrize(
    ("held", "expected"),
    [
        # the server finished nothing and holds no open utterance: it got the
        # done (the context is live: the utterance is being spoken)
        (0, []),
        # it holds 6 characters of an open utterance: the done was lost
        (6, ["DONE"]),
        (3, ["lo ", "DONE"]),
        # not listed after the replay: it got none of it
        (None, ["Hello ", "DONE"]),
    ],
)
def test_a_lost_input_done_is_sent_again(held: int | None, expected: list[str]) -> None:
    ledger = TextLedger()
    ledger.text("c", "Hello ", sent=True)
    ledger.done("c", sent=True)
    assert _texts(ledger.resend({} if held is None else {"c": held})) == expected


def test_a_finished_utterance_is_never_sent_again() -> None:
    ledger = TextLedger()
    ledger.text("c", "One.", sent=True)
    ledger.done("c", sent=True)
    ledger.text("c", "Two ", sent=True)
    ledger.finished("c")  # session.done of the first (replayed, say)
    # the second is open with 4 characters held: nothing to send
    assert ledger.resend({"c": 4}) == []
    assert ledger.unfinished() == {"c": "Two "}


def test_text_after_a_done_goes_to_a_new_utterance() -> None:
    ledger = TextLedger()
    ledger.text("c", "One. ", sent=True)
    ledger.done("c", sent=True)
    ledger.text("c", "Two ", sent=True)
    ledger.text("c", "three.", sent=False)
    # open utterance "Two " held: the first is being spoken
    assert _texts(ledger.resend({"c": 4})) == ["three."]


def test_cancelled_text_is_never_sent_again_nor_reported() -> None:
    ledger = TextLedger()
    ledger.text("a", "Stop me.", sent=True)
    ledger.text("b", "Keep me.", sent=False)
    ledger.cancel("*")
    assert ledger.resend({}) == []
    assert ledger.unfinished() == {}
    ledger.text("a", "New.", sent=False)  # a new utterance after the cancel
    assert _texts(ledger.resend({"a": 0})) == ["New."]


def test_more_held_than_sent_sends_nothing_of_what_was_sent() -> None:
    ledger = TextLedger()
    ledger.text(None, "abc", sent=True)
    ledger.text(None, "def", sent=False)
    assert _texts(ledger.resend({None: 10})) == ["def"]


def test_session_done_removes_the_oldest_utterance() -> None:
    tracker = ResumeTracker()
    tracker.text("c", "One. ")
    tracker.done("c")
    tracker.text("c", "Two.")
    tracker.event("session.done", "c")
    assert tracker.unfinished() == {"c": "Two."}
    tracker.new_session()
    assert tracker.unfinished() == {} and tracker.token is None
