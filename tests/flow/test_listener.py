"""The one listener model (gateway.flow.listener), pure, as tables.

Each case is a flow-control mode, a script of frames sent, playback reports
and utterance starts, and at one moment what the three users read from it:
the segmentation policy (``ahead_s``), a cancel report (``position``) and
admission (``lead_ms``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.flow.listener import Listener
from gateway.protocol import FlowControl

#: ("sent", frame_ms, at) | ("played", played_ms, at) | ("utterance",)
Step = tuple[str, ...] | tuple[str, float, float]


def _run(listener: Listener, steps: list[Step]) -> None:
    for step in steps:
        match step:
            case ("sent", frame_ms, at):
                listener.on_sent(float(frame_ms), float(at))
            case ("played", played_ms, at):
                listener.on_played(float(played_ms), float(at))
            case ("utterance",):
                listener.new_utterance()
            case _:
                raise AssertionError(step)


def _sent(frames: int, frame_ms: float, at: float) -> list[Step]:
    return [("sent", frame_ms, at)] * frames


CASES: list[tuple[str, FlowControl, list[Step], float, float, float, str, float]] = [
    # name, mode, steps, now, ahead_s, position_ms, source, lead_ms
    (
        "send clock plays from the first frame",
        "none",
        _sent(2, 100, 10.0),
        10.05,
        0.15,
        200,
        "sent_ms",
        0,
    ),
    ("send clock runs dry", "none", _sent(2, 100, 10.0), 11.0, 0.0, 200, "sent_ms", 0),
    (
        "send clock restarts after a gap",
        "none",
        [*_sent(2, 100, 10.0), ("sent", 100, 12.0)],
        12.0,
        0.1,
        300,
        "sent_ms",
        0,
    ),
    (
        "each utterance restarts the send clock",
        "none",
        [("sent", 9000, 0.0), ("utterance",)],
        3.0,
        0.0,
        9000,
        "sent_ms",
        0,
    ),
    (
        "a new utterance does not reset admission",
        "realtime",
        [("sent", 9000, 0.0), ("utterance",)],
        3.0,
        0.0,
        3000,
        "estimate",
        6000,
    ),
    (
        "reports hold across utterances",
        "none",
        [("sent", 9000, 0.0), ("played", 1000, 1.0), ("utterance",)],
        3.0,
        6.0,
        9000,
        "sent_ms",
        0,
    ),
    (
        "reports take over from the send clock",
        "none",
        [*_sent(10, 100, 0.0), ("played", 200, 0.5)],
        0.6,
        0.7,
        1000,
        "sent_ms",
        0,
    ),
    (
        "ack counts only what was reported",
        "ack",
        [*_sent(5, 20, 0.0), ("played", 40, 0.0)],
        0.03,
        0.03,
        40,
        "played_ms",
        60,
    ),
    (
        "ack ignores an older report",
        "ack",
        [*_sent(5, 20, 0.0), ("played", 40, 0.0), ("played", 10, 0.01)],
        0.02,
        0.04,
        40,
        "played_ms",
        60,
    ),
    ("ack before any report", "ack", _sent(5, 20, 0.0), 0.0, 0.1, 0, "played_ms", 100),
    (
        "realtime plays with the clock",
        "realtime",
        _sent(10, 20, 10.0),
        10.1,
        0.1,
        100,
        "estimate",
        100,
    ),
    (
        "realtime never beyond what was sent",
        "realtime",
        _sent(10, 20, 10.0),
        11.0,
        0.0,
        200,
        "estimate",
        0,
    ),
    (
        "realtime restarts after an underrun",
        "realtime",
        [*_sent(10, 20, 10.0), ("sent", 20, 20.0)],
        20.01,
        0.01,
        210,
        "estimate",
        10,
    ),
]


@pytest.mark.parametrize(
    ("mode", "steps", "now", "ahead_s", "position", "source", "lead"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_listener_table(
    mode: FlowControl,
    steps: list[Step],
    now: float,
    ahead_s: float,
    position: float,
    source: str,
    lead: float,
) -> None:
    listener = Listener(mode, 1000)
    _run(listener, steps)
    assert listener.ahead_s(now) == pytest.approx(ahead_s)
    at, said = listener.position(now)
    assert at == pytest.approx(position) and said == source
    assert listener.lead_ms(now) == pytest.approx(lead)
    assert listener.reported == any(step[0] == "played" for step in steps)


def test_ack_window_bounds_the_lead() -> None:
    listener = Listener("ack", 100)
    sent = 0
    while listener.fits(20, 0.0):
        listener.on_sent(20, 0.0)
        sent += 20
    assert sent == 100
    listener.on_played(40, 0.0)
    assert listener.fits(20, 0.0)
    listener.on_played(10, 0.0)  # backwards reports are ignored
    assert listener.played_ms == 40


def test_one_frame_may_exceed_an_empty_window() -> None:
    listener = Listener("ack", 100)
    assert listener.fits(500, 0.0)  # nothing outstanding: never deadlock


def test_none_admits_everything() -> None:
    listener = Listener("none", 100)
    for _ in range(50):
        assert listener.fits(20, 0.0)
        listener.on_sent(20, 0.0)
    assert listener.position(0.0) == (1000, "sent_ms")


async def test_admit_waits_for_a_report_and_counts_each_frame_once() -> None:
    listener = Listener("ack", 100)
    assert await listener.admit(100, lambda: False)
    waiting = asyncio.create_task(listener.admit(20, lambda: False))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    listener.on_played(50, time.monotonic())
    assert await waiting
    assert listener.sent_ms == 120
    # the send clock saw both frames: 120 ms ahead of a fresh player, less the time since
    assert 0.0 < listener.ahead_s(time.monotonic()) <= 0.12


async def test_admit_gives_up_without_counting_when_stopped() -> None:
    listener = Listener("ack", 100)
    assert await listener.admit(100, lambda: False)
    stopped = False
    waiting = asyncio.create_task(listener.admit(20, lambda: stopped))
    await asyncio.sleep(0.01)
    stopped = True
    listener.interrupt()
    assert await waiting is False
    assert listener.sent_ms == 100
