"""The segment pipeline's bookkeeping (gateway.delivery.queue), on the real
synthetic engine's jobs."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.delivery.queue import SegmentQueue
from gateway.engines.base import SegmentRequest, StreamRequest, SynthesisJob
from gateway.engines.synthetic import SyntheticEngine
from gateway.text.whole_text import speakable_segments
from tests.conftest import test_settings as make_settings


@dataclass(eq=False)
class Seg:
    text: str
    job: SynthesisJob | None = None


def _queue(room: list[bool]) -> tuple[SegmentQueue[Seg], list[str]]:
    engine = SyntheticEngine(make_settings(engine="synthetic"))
    stream = engine.open_stream(StreamRequest(voice="tone"))
    submitted: list[str] = []

    def submit(seg: Seg) -> None:
        submitted.append(seg.text)
        seg.job = stream.submit(SegmentRequest(text=seg.text))

    return SegmentQueue(submit, room=lambda: room[0]), submitted


async def test_the_head_is_prefetched_one_ahead() -> None:
    queue, submitted = _queue([True])
    for text in ("a", "b", "c"):
        queue.append(Seg(text))
    assert submitted == ["a"]  # only the head waits submitted
    assert queue.start_next().text == "a"
    assert submitted == ["a", "b"]  # the next one overlaps the current
    queue.finish()
    assert [s.text for s in queue] == ["b", "c"]


async def test_no_prefetch_without_room_but_the_current_always_goes() -> None:
    room = [False]
    queue, submitted = _queue(room)
    queue.append(Seg("a"))
    queue.append(Seg("b"))
    assert submitted == []
    queue.start_next()
    assert submitted == ["a"]  # the segment to speak is submitted regardless
    room[0] = True
    queue.finish()
    assert submitted == ["a", "b"]  # room came back: prefetched


async def test_drop_and_clear_cancel_jobs() -> None:
    queue, _ = _queue([True])
    segs = [Seg(t) for t in ("a", "b", "c")]
    for seg in segs:
        queue.append(seg)
    current = queue.start_next()
    queue.drop(lambda s: s.text == "b")
    assert [s.text for s in queue.waiting] == ["c"]
    assert segs[1].job is not None and segs[1].job.stats.cancelled
    queue.clear()
    assert current.job is not None and current.job.stats.cancelled
    assert not queue.waiting and queue.current is current


async def test_speakable_segments() -> None:
    assert speakable_segments("Hello there. General Kenobi!", 300) == [
        "Hello there.",
        "General Kenobi!",
    ]
    assert speakable_segments(" ... !!", 300) == []  # nothing to say
