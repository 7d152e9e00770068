"""The streamed SNAC decode equals SNAC's whole-utterance decode.

A seeded random-weight 24 kHz SNAC (nothing downloaded); codes from distinct
random frames, tokens arriving 1 to 7 at a time through the real mapper."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from gateway.engines.orpheus.codes import CodeMapper, Frame, frame_tokens
from gateway.vocoders.snac_stream import (
    SNAC_24KHZ_CONFIG,
    NoiseMode,
    SnacBatch,
    SnacStream,
    SnacStreamDecoder,
    UnsupportedSnacError,
    build_snac_24khz,
    decode_offline,
    keyed_noise,
    load_snac_24khz,
)

pytest.importorskip("snac")

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return build_snac_24khz()


def _frames(seed: int, n: int) -> list[Frame]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(4096) for _ in range(7)) for _ in range(n)]  # type: ignore[misc]


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    assert ref.shape == got.shape
    err = float(np.sum((ref.astype(np.float64) - got) ** 2))
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(err, 1e-30)))


def test_reference_is_snacs_own_decode(model: torch.nn.Module) -> None:
    """``decode_offline`` without noise is SNAC's ``decode`` of a noise-free
    model with the same weights."""
    from snac import SNAC

    plain = SNAC(**{**SNAC_24KHZ_CONFIG, "noise": False}).eval()
    # without its noise block (index 2) a decoder block's later layers move up one
    pattern = re.compile(r"^(decoder\.model\.[2-5]\.block\.)(\d+)\.(.*)$")
    state = {}
    for key, value in model.state_dict().items():
        match = pattern.match(key)
        if match and int(match[2]) >= 2:
            if int(match[2]) == 2:
                assert ".linear." in key  # the noise block's only weights
                continue
            key = f"{match[1]}{int(match[2]) - 1}.{match[3]}"
        state[key] = value
    plain.load_state_dict(state)
    frames = _frames(7, 20)
    codes = [
        torch.tensor([[f[p] for f in frames for p in ps]]) for ps in ((0,), (1, 4), (2, 3, 5, 6))
    ]
    assert [c.shape[1] for c in codes] == [20, 40, 80]
    with torch.inference_mode():
        expected = plain.decode(codes)[0, 0].numpy()
    got = decode_offline(model, frames, noise="off")
    assert got.shape == (20 * 2048,)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    # a random-weight model still makes a signal, not silence or a saturated tanh
    assert float(got.std()) > 0.01 and float(np.abs(got).max()) < 0.99


def test_snac_noise_is_not_reproducible_but_keyed_noise_is(model: torch.nn.Module) -> None:
    frames = _frames(8, 6)
    codes = [
        torch.tensor([[f[p] for f in frames for p in ps]]) for ps in ((0,), (1, 4), (2, 3, 5, 6))
    ]
    with torch.inference_mode():
        a, b = model.decode(codes), model.decode(codes)
    assert not torch.equal(a, b)  # why the noise must be keyed or off
    keyed = decode_offline(model, frames, "keyed", seed=3)
    assert np.array_equal(keyed, decode_offline(model, frames, "keyed", seed=3))
    assert not np.array_equal(keyed, decode_offline(model, frames, "keyed", seed=4))
    assert not np.array_equal(keyed, decode_offline(model, frames, "off"))


def test_keyed_noise_is_standard_normal_and_positional() -> None:
    keys = torch.tensor([1, 2])
    pos = torch.arange(200_000)[None, :].expand(2, -1)
    noise = keyed_noise(keys, pos)
    assert abs(float(noise.mean())) < 0.01 and abs(float(noise.std()) - 1) < 0.01
    assert float(torch.corrcoef(noise)[0, 1].abs()) < 0.01  # keys are independent
    part = keyed_noise(keys[:1], torch.arange(5000, 5100)[None, :])
    assert torch.equal(part[0], noise[0, 5000:5100])


def _tokens_in_chunks(frames: list[Frame], rng: random.Random) -> list[list[int]]:
    tokens = [t for f in frames for t in frame_tokens(f)]
    chunks = []
    while tokens:
        n = rng.randint(1, 7)
        chunks.append(tokens[:n])
        tokens = tokens[n:]
    return chunks


@pytest.mark.parametrize(("noise", "count"), [("keyed", 56), ("off", 16)])
def test_streamed_equals_offline(model: torch.nn.Module, noise: NoiseMode, count: int) -> None:
    """Production (keyed noise) over 56 distinct frames; without noise, 16."""
    frames = _frames(42, count)
    assert len(set(frames)) == count  # distinct frames: a repeated frame proves nothing
    decoder = SnacStreamDecoder(model, CPU, noise=noise)
    assert decoder.lookahead_samples == 4757
    stream = SnacStream(decoder, seed=9)
    mapper = CodeMapper()
    rng = random.Random(5)
    pieces = []
    received = 0
    for chunk in _tokens_in_chunks(frames, rng):
        new = mapper.push(chunk)
        received += len(new)
        piece = stream.push(new)
        pieces.append(piece)
        # exactly the samples the frames so far determine, never more
        assert sum(p.shape[0] for p in pieces) == max(0, 2048 * received - 4757)
    tail = stream.finish()
    assert tail.shape[0] == min(4757, 2048 * len(frames))
    got = np.concatenate([*pieces, tail])
    ref = decode_offline(model, frames, noise=noise, seed=9)
    assert got.shape == ref.shape == (count * 2048,)
    assert snr_db(ref, got) >= 60


def test_short_and_empty_utterances(model: torch.nn.Module) -> None:
    decoder = SnacStreamDecoder(model, CPU, noise="keyed")
    for n in (0, 1, 2):
        frames = _frames(n, n)
        stream = SnacStream(decoder, seed=1)
        got = np.concatenate([stream.push(frames), stream.finish()])
        assert got.shape == (2048 * n,)
        if n:
            assert snr_db(decode_offline(model, frames, seed=1), got) >= 60


def test_batched_equals_per_stream(model: torch.nn.Module) -> None:
    """Streams join and leave a batch and push different frame counts; each
    stream's audio equals its own offline decode and its own stream alone."""
    decoder = SnacStreamDecoder(model, CPU, noise="keyed")
    plans = {  # key: (seed, first tick, frames per tick)
        "a": (1, 0, [1, 1, 2, 1, 1, 1, 3, 1]),
        "b": (2, 0, [1, 0, 1, 1, 1, 1]),
        "c": (3, 2, [2, 1, 1, 0, 1, 1, 1]),
        "d": (4, 4, [1, 1]),
    }
    frames = {k: _frames(100 + seed, sum(counts)) for k, (seed, _, counts) in plans.items()}
    batch = SnacBatch(decoder)
    audio: dict[str, list[np.ndarray]] = {k: [] for k in plans}
    sent = dict.fromkeys(plans, 0)
    tick = 0
    while any(k in batch.rows or tick <= plans[k][1] for k in plans):
        for key, (seed, first, _) in plans.items():
            if tick == first:
                batch.join(key, seed)
        work = {}
        ending = []
        for key in list(batch.keys):
            counts = plans[key][2]
            step = tick - plans[key][1]
            if step < len(counts):
                work[key] = frames[key][sent[key] : sent[key] + counts[step]]
                sent[key] += counts[step]
            else:
                ending.append(key)
        for key, piece in batch.step(work).items():
            audio[key].append(piece)
        for key, piece in batch.finish(ending).items():
            audio[key].append(piece)
        tick += 1
    assert len(batch) == 0
    for key, (seed, _, counts) in plans.items():
        got = np.concatenate(audio[key])
        assert snr_db(decode_offline(model, frames[key], seed=seed), got) >= 60
        alone = SnacStream(decoder, seed=seed)
        i = 0
        pieces = []
        for n in counts:
            pieces.append(alone.push(frames[key][i : i + n]))
            i += n
        pieces.append(alone.finish())
        np.testing.assert_allclose(got, np.concatenate(pieces), atol=1e-5)


def test_batch_rejects_misuse(model: torch.nn.Module) -> None:
    batch = SnacBatch(SnacStreamDecoder(model, CPU))
    batch.join("x")
    with pytest.raises(ValueError):
        batch.join("x")
    with pytest.raises(KeyError):
        batch.step({"y": _frames(1, 1)})
    with pytest.raises(ValueError, match="7 codes"):
        batch.step({"x": [(0, 1, 2, 3, 4, 5, 4096)]})
    with pytest.raises(ValueError, match="7 codes"):
        batch.step({"x": [(0, 1, 2, 3, 4, 5)]})
    assert batch.rows["x"].pushed == 0  # nothing was decoded
    # a stream listed twice, or one that never joined, changes nothing: the
    # batch's rows and state stay in step for the streams in it
    batch.join("z")
    sizes = [s.shape[0] for s in batch.state]
    for keys in (["x", "x"], ["x", "y"]):
        for call in (batch.finish, batch.leave_many):
            with pytest.raises((ValueError, KeyError)):
                call(keys)
            assert batch.keys == ["x", "z"] and [s.shape[0] for s in batch.state] == sizes
    batch.step({"x": _frames(1, 2), "z": _frames(2, 2)})
    assert set(batch.finish(["x", "z"])) == {"x", "z"} and len(batch) == 0


def test_load_from_folder(model: torch.nn.Module, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SNAC_24KHZ_CONFIG))
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    loaded = load_snac_24khz(tmp_path)
    frames = _frames(3, 4)
    assert np.array_equal(
        decode_offline(loaded, frames, "off"), decode_offline(model, frames, "off")
    )
    # the 44.1 kHz defaults are refused, not silently decoded at the wrong rate
    (tmp_path / "config.json").write_text(json.dumps({"sampling_rate": 44100}))
    with pytest.raises(UnsupportedSnacError):
        load_snac_24khz(tmp_path)


def test_graphed_tick_needs_cuda(model: torch.nn.Module) -> None:
    """``GraphedTick`` is measured on a GPU (bench/snac_gpu_bench.py checks it
    against the eager tick there); on the CPU it refuses plainly."""
    from gateway.vocoders.snac_graph import GraphedTick

    batch = SnacBatch(SnacStreamDecoder(model, CPU))
    batch.join("x")
    with pytest.raises(ValueError, match="CUDA"):
        GraphedTick(batch)
