"""The orpheus decode worker: one thread, one ``SnacBatch``, real delivery.

A seeded random-weight 24 kHz SNAC (nothing downloaded), real
``DeliveredJob``s read by tasks as the speaker reads them, token ids pushed
from the event loop in pieces of 1 to 7 as vLLM streams them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import pytest
import torch

from gateway.engines.base import AudioChunk, SegmentRequest, StreamRequest, SynthesisError
from gateway.engines.delivery import DeliveredJob
from gateway.engines.orpheus.codes import Frame, frame_tokens
from gateway.engines.orpheus.decoder import DecodeStream, DecodeWorker, released_samples
from gateway.engines.orpheus.tokens import END_OF_SPEECH
from gateway.flow.budget import DecodeBudget
from gateway.vocoders.snac_stream import SnacStreamDecoder, build_snac_24khz, decode_offline

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(4321)
    return build_snac_24khz()


@pytest.fixture
def worker(model: torch.nn.Module) -> Iterator[DecodeWorker]:
    w = DecodeWorker(SnacStreamDecoder(model, CPU, noise="keyed"), max_pending=64)
    yield w
    w.close()


def frames_of(seed: int, n: int) -> list[Frame]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(4096) for _ in range(7)) for _ in range(n)]  # type: ignore[misc]


def tokens_of(frames: list[Frame]) -> list[int]:
    return [t for f in frames for t in frame_tokens(f)]


class Job(DeliveredJob):
    """A real delivered job that records the order its chunks were produced in."""

    order: ClassVar[list[str]] = []

    def __init__(self, name: str, index: int = 0, budget: DecodeBudget | None = None) -> None:
        request = StreamRequest("tara", label=name, budget=budget)
        super().__init__(SegmentRequest(name), request, index, asyncio.get_running_loop())
        self.name = name

    def chunk(self, samples: np.ndarray) -> bool:
        Job.order.append(self.name)
        return super().chunk(samples)


class Reader:
    def __init__(self, job: DeliveredJob, release: bool = True) -> None:
        self.job = job
        self.chunks: list[np.ndarray] = []
        self.error: SynthesisError | None = None
        self.release = release
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for event in self.job:
                if isinstance(event, AudioChunk):
                    self.chunks.append(event.samples)
                    if self.release and self.job.request.budget is not None:
                        self.job.request.budget.release(self.job, event.samples.size / 24000)
        except SynthesisError as exc:
            self.error = exc

    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


async def feed(stream: DecodeStream, tokens: list[int], rng: random.Random) -> None:
    i = 0
    while i < len(tokens):
        n = rng.randint(1, 7)
        assert await stream.push(tuple(tokens[i : i + n]))
        i += n
        await asyncio.sleep(0.002 * rng.random())


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    assert ref.shape == got.shape, (ref.shape, got.shape)
    err = float(np.sum((ref.astype(np.float64) - got) ** 2))
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(err, 1e-30)))


def test_released_samples_follow_the_lookahead() -> None:
    assert [released_samples(p, 1, 2048, 4757) for p in range(5)] == [0, 0, 1387, 2048, 2048]
    assert released_samples(0, 10, 2048, 4757) == 2048 * 10 - 4757


async def test_streams_joining_and_leaving_mid_batch_get_their_own_decode(
    model: torch.nn.Module, worker: DecodeWorker
) -> None:
    """Three segments overlap in every way (one alone, two together, one
    leaving while another joins); each one's audio is its own offline decode."""
    rng = random.Random(5)
    plans = {"a": frames_of(1, 18), "b": frames_of(2, 9), "c": frames_of(3, 13)}
    jobs = {name: Job(name, index=i) for i, name in enumerate(plans)}
    readers = {name: Reader(job) for name, job in jobs.items()}
    streams = {name: worker.open(jobs[name], seed=10 + i) for i, name in enumerate(plans)}

    async def run(name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        await feed(streams[name], tokens_of(plans[name]), rng)
        streams[name].end()

    await asyncio.gather(run("a", 0), run("b", 0.05), run("c", 0.15))
    await asyncio.wait_for(asyncio.gather(*(r.task for r in readers.values())), 120)
    for i, (name, frames) in enumerate(plans.items()):
        reader = readers[name]
        assert reader.error is None
        expected = decode_offline(model, frames, noise="keyed", seed=10 + i)
        got = reader.audio()
        assert got.size == 2048 * len(frames)
        assert snr_db(expected, got) >= 60
        assert jobs[name].stats.audio_seconds == pytest.approx(got.size / 24000)
        assert jobs[name].stats.extra["frames"] == len(frames)
    assert len(worker.batch) == 0 and worker.active() == 0


async def test_a_new_segments_first_frames_are_decoded_first(worker: DecodeWorker) -> None:
    Job.order = []
    old = Job("old", index=1)
    old_reader = Reader(old)
    old_stream = worker.open(old, seed=1)
    old_frames = frames_of(7, 8)
    await feed(old_stream, tokens_of(old_frames[:5]), random.Random(1))
    async with asyncio.timeout(30):
        while not old_reader.chunks:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the worker is idle, old has delivered audio
    new = Job("new", index=0)  # an utterance's first segment
    new_reader = Reader(new)
    new_stream = worker.open(new, seed=2)
    ticks = worker.ticks
    Job.order = []
    with worker.cond:  # both arrive before the worker takes either: one tick
        assert await old_stream.push(tuple(tokens_of(old_frames[5:])))
        assert await new_stream.push(tuple(tokens_of(frames_of(8, 3))))
    async with asyncio.timeout(30):
        while len(Job.order) < 2:
            await asyncio.sleep(0.01)
    assert worker.ticks == ticks + 1
    assert Job.order[:2] == ["new", "old"]
    for stream in (old_stream, new_stream):
        stream.end()
    await asyncio.wait_for(asyncio.gather(old_reader.task, new_reader.task), 60)
    assert new_reader.audio().size == 3 * 2048


async def test_a_stalled_listener_holds_bounded_audio_and_frames(
    model: torch.nn.Module,
) -> None:
    """Nothing is sent (the budget is never released): decoding stops at the
    budget plus one chunk, the frames waiting stop at ``max_pending`` and the
    token push waits; once the listener reads again, everything arrives."""
    worker = DecodeWorker(SnacStreamDecoder(model, CPU, noise="keyed"), max_pending=6)
    try:
        budget = DecodeBudget(0.3)
        job = Job("stalled", budget=budget)
        reader = Reader(job, release=False)
        stream = worker.open(job, seed=3)
        frames = frames_of(9, 40)
        tokens = tokens_of(frames)
        pushing = asyncio.create_task(feed(stream, tokens, random.Random(2)))
        await asyncio.sleep(3.0)
        assert not pushing.done()  # the push waits: vLLM would be held by TCP
        with worker.cond:
            assert len(stream.pending) <= 6 + 4  # max_pending, plus one tick put back
        largest = max(c.size for c in reader.chunks) / 24000
        assert job.stats.audio_samples / 24000 <= budget.limit_s + largest + 1e-6
        reader.release = True
        budget.release(job)
        await asyncio.wait_for(pushing, 60)
        stream.end()
        await asyncio.wait_for(reader.task, 60)
        assert reader.audio().size == 2048 * len(frames)
        expected = decode_offline(model, frames, noise="keyed", seed=3)
        assert snr_db(expected, reader.audio()) >= 60
    finally:
        worker.close()


async def test_abort_drops_the_stream_and_its_state(worker: DecodeWorker) -> None:
    job = Job("cancelled")
    reader = Reader(job)
    stream = worker.open(job, seed=4)
    await feed(stream, tokens_of(frames_of(11, 6)), random.Random(3))
    async with asyncio.timeout(30):
        while not reader.chunks:
            await asyncio.sleep(0.01)
    job.cancel()
    stream.abort()
    produced = job.stats.chunks
    assert not await stream.push(tuple(tokens_of(frames_of(12, 3))))
    await asyncio.wait_for(reader.task, 10)
    async with asyncio.timeout(10):
        while worker.active() or len(worker.batch):
            await asyncio.sleep(0.01)
    assert job.stats.chunks <= produced + 1


async def test_end_of_speech_and_stray_tokens(model: torch.nn.Module, worker: DecodeWorker) -> None:
    """Tokens after ``<end_of_speech>`` are ignored; an off-layout token costs
    its frame (the mapper's resynchronisation), never the stream."""
    frames = frames_of(13, 6)
    tokens = tokens_of(frames)
    broken = [*tokens[:7], 128000, *tokens[7:10], *tokens[14:], END_OF_SPEECH, *tokens[:7]]
    job = Job("stray")
    reader = Reader(job)
    stream = worker.open(job, seed=5)
    await feed(stream, broken, random.Random(4))
    stream.end()
    await asyncio.wait_for(reader.task, 60)
    kept = [frames[0], *frames[2:]]  # frame 1 was cut by the stray id, then resynchronised
    expected = decode_offline(model, kept, noise="keyed", seed=5)
    assert snr_db(expected, reader.audio()) >= 60
    assert job.stats.extra["dropped_tokens"] == 1 + 3  # the stray id, frame 1's three


async def test_a_segment_without_frames_fails(worker: DecodeWorker) -> None:
    job = Job("silent")
    reader = Reader(job)
    stream = worker.open(job, seed=6)
    assert await stream.push((128000, 1000, END_OF_SPEECH))
    stream.end()
    await asyncio.wait_for(reader.task, 10)
    assert reader.error is not None and "no speech" in str(reader.error)


async def test_a_segment_of_several_generations_decodes_as_one_stream(
    model: torch.nn.Module, worker: DecodeWorker
) -> None:
    """Bounded work per item: a long segment is several completions into one
    decode stream (``next_item`` between them).  The audio is the offline
    decode of every item's frames in a row: nothing lost or flushed at the
    seams.  The first item ends with ``<end_of_speech>`` and a stray token
    after it, the second mid-frame (``max_tokens``): neither ends the stream
    or shifts the next item's frames."""
    items = [frames_of(21, 7), frames_of(22, 5), frames_of(23, 6)]
    sent = [
        [*tokens_of(items[0]), END_OF_SPEECH, *tokens_of(items[0][:1])],
        [*tokens_of(items[1]), *tokens_of(items[2][:1])[:4]],  # a partial frame
        tokens_of(items[2]),
    ]
    job = Job("items")
    reader = Reader(job)
    stream = worker.open(job, seed=9)
    rng = random.Random(8)
    for index, tokens in enumerate(sent):
        if index:
            stream.next_item()
        await feed(stream, tokens, rng)
    stream.end()
    await asyncio.wait_for(reader.task, 60)
    assert reader.error is None
    frames = [frame for item in items for frame in item]
    expected = decode_offline(model, frames, noise="keyed", seed=9)
    got = reader.audio()
    assert got.size == 2048 * len(frames)
    assert snr_db(expected, got) >= 60
    assert job.stats.extra["frames"] == len(frames)
    assert job.stats.extra["dropped_tokens"] == 4  # the second item's partial frame


async def test_a_segment_whose_tail_waits_for_room_ends_once(
    model: torch.nn.Module, worker: DecodeWorker
) -> None:
    """A segment ends while its reader has not taken its chunks, so the
    decoder's tail has no room: the tail waits for the reader, then the
    segment ends once, with all of its audio.  (It used to be listed twice
    after such a wait, and its second end broke the shared batch's
    bookkeeping for every stream in it: seen in tests_vllm under CI.)"""
    job = Job("tail")
    stream = worker.open(job, seed=4)
    frames = frames_of(11, 5)
    # two pushes, two chunks nobody reads yet (MAX_UNDELIVERED)
    for part in (frames[:3], frames[3:]):
        pushed = stream.pushed
        assert await stream.push(tuple(tokens_of(part)))
        async with asyncio.timeout(30):
            while stream.pushed == pushed:
                await asyncio.sleep(0.01)
    stream.end()
    async with asyncio.timeout(30):
        while not stream.waiting:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # the worker tried the tail and was refused
    assert not job.finished
    other = Job("other", index=1)
    other_reader = Reader(other)
    other_stream = worker.open(other, seed=5)
    other_frames = frames_of(12, 6)
    await feed(other_stream, tokens_of(other_frames), random.Random(3))
    reader = Reader(job)  # the reader takes its chunks: the tail has room
    other_stream.end()
    await asyncio.wait_for(asyncio.gather(reader.task, other_reader.task), 60)
    assert reader.error is None and other_reader.error is None
    for got, plan, seed in ((reader, frames, 4), (other_reader, other_frames, 5)):
        expected = decode_offline(model, plan, noise="keyed", seed=seed)
        assert snr_db(expected, got.audio()) >= 60
    assert len(worker.batch) == 0 and worker.active() == 0
