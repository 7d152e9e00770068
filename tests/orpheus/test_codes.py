"""The Orpheus token-to-code mapper and the prompt layout (pure, no model)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.engines.orpheus.codes import (
    CODEBOOK_SIZE,
    CodeMapper,
    Frame,
    audio_position,
    frame_tokens,
    levels,
    token_id,
)
from gateway.engines.orpheus.tokens import (
    AUDIO_TOKEN_BASE,
    END_OF_SPEECH,
    START_OF_SPEECH,
    prompt_ids,
    voice_text,
)

codes = st.integers(0, CODEBOOK_SIZE - 1)
frames_st = st.lists(st.tuples(*[codes] * 7), min_size=0, max_size=30)


def _frames(seed: int, n: int) -> list[Frame]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(CODEBOOK_SIZE) for _ in range(7)) for _ in range(n)]  # type: ignore[misc]


def _tokens(frames: list[Frame]) -> list[int]:
    return [t for f in frames for t in frame_tokens(f)]


def test_formula_per_position() -> None:
    # the k-th audio token carries id - 128266 - (k mod 7) * 4096
    frame: Frame = (0, 1, 4095, 7, 100, 2000, 4094)
    ids = frame_tokens(frame)
    assert ids == [
        128266,
        128266 + 4096 + 1,
        128266 + 2 * 4096 + 4095,
        128266 + 3 * 4096 + 7,
        128266 + 4 * 4096 + 100,
        128266 + 5 * 4096 + 2000,
        128266 + 6 * 4096 + 4094,
    ]
    mapper = CodeMapper()
    assert mapper.push(ids + ids) == [frame, frame]
    for k, tid in enumerate(ids * 2):
        assert tid - 128266 - (k % 7) * 4096 == frame[k % 7]


def test_levels_order() -> None:
    f1: Frame = (1, 2, 3, 4, 5, 6, 7)
    f2: Frame = (10, 20, 30, 40, 50, 60, 70)
    assert levels([f1, f2]) == ([1, 10], [2, 5, 20, 50], [3, 4, 6, 7, 30, 40, 60, 70])


def test_audio_position_edges() -> None:
    assert audio_position(AUDIO_TOKEN_BASE - 1) is None
    assert audio_position(AUDIO_TOKEN_BASE) == 0
    assert audio_position(AUDIO_TOKEN_BASE + 4096) == 1
    assert audio_position(AUDIO_TOKEN_BASE + 7 * 4096 - 1) == 6
    assert audio_position(AUDIO_TOKEN_BASE + 7 * 4096) is None
    with pytest.raises(ValueError):
        token_id(7, 0)
    with pytest.raises(ValueError):
        token_id(0, 4096)


A, B, C = _frames(1, 3)
TA, TB, TC = frame_tokens(A), frame_tokens(B), frame_tokens(C)
TEXT = 1234  # a text token id
BELOW, ABOVE = AUDIO_TOKEN_BASE - 1, AUDIO_TOKEN_BASE + 7 * 4096


@pytest.mark.parametrize(
    ("tokens", "frames", "dropped_tokens", "dropped_frames"),
    [
        pytest.param(TA + TB, [A, B], 0, 0, id="clean"),
        # a foreign token mid-frame costs that frame; the next frame is intact
        pytest.param([*TA[:3], TEXT, *TB], [B], 4, 1, id="text-token-mid-frame"),
        pytest.param([*TA[:3], END_OF_SPEECH, *TB], [B], 4, 1, id="control-token-mid-frame"),
        pytest.param([*TA[:5], BELOW, *TB], [B], 6, 1, id="below-range"),
        pytest.param([*TA[:5], ABOVE, *TB], [B], 6, 1, id="above-range"),
        # a skipped position: the frame is dropped, the stream waits for position 0
        pytest.param(TA[:2] + TA[3:] + TB, [B], 6, 1, id="skipped-position"),
        # a repeated position
        pytest.param(TA[:3] + TA[2:] + TB, [B], 8, 1, id="repeated-position"),
        # starts mid-frame: tokens before the first position-0 id are dropped
        pytest.param(TA[4:] + TB + TC, [B, C], 3, 0, id="starts-mid-frame"),
        # a position-0 id mid-frame starts a new frame at once
        pytest.param(TA[:4] + TB + TC, [B, C], 4, 1, id="position-0-mid-frame"),
        # off-position tokens while waiting for position 0 are dropped one by one
        pytest.param([TEXT, *TA[1:3], START_OF_SPEECH, *TB], [B], 4, 0, id="garbage-first"),
        # a trailing partial frame is dropped by finish()
        pytest.param(TA + TB[:6], [A], 6, 1, id="trailing-partial"),
        pytest.param([], [], 0, 0, id="empty"),
        pytest.param([TEXT] * 20, [], 20, 0, id="only-garbage"),
    ],
)
def test_resynchronisation(
    tokens: list[int], frames: list[Frame], dropped_tokens: int, dropped_frames: int
) -> None:
    mapper = CodeMapper()
    got = mapper.push(tokens)
    mapper.finish()
    assert got == frames
    assert mapper.frames == len(frames)
    assert mapper.dropped_tokens == dropped_tokens
    assert mapper.dropped_frames == dropped_frames
    # every token is either in a frame or counted as dropped
    assert 7 * len(frames) + dropped_tokens == len(tokens)


@st.composite
def _chunked(draw: st.DrawFn, tokens: list[int]) -> list[list[int]]:
    chunks: list[list[int]] = []
    i = 0
    while i < len(tokens):
        n = draw(st.integers(1, 7))
        chunks.append(tokens[i : i + n])
        i += n
    return chunks


@given(st.data(), frames_st)
def test_any_chunking_gives_the_same_frames(data: st.DataObject, frames: list[Frame]) -> None:
    tokens = _tokens(frames)
    mapper = CodeMapper()
    out: list[Frame] = []
    for chunk in data.draw(_chunked(tokens)):
        out.extend(mapper.push(chunk))
    assert out == frames
    assert mapper.finish() == 0


noisy_token = st.one_of(
    st.integers(AUDIO_TOKEN_BASE, AUDIO_TOKEN_BASE + 7 * 4096 - 1),  # audio, any position
    st.integers(0, 160000),  # anything
)


@given(st.data(), st.lists(noisy_token, max_size=200))
def test_chunking_invariance_with_invalid_tokens(data: st.DataObject, tokens: list[int]) -> None:
    whole = CodeMapper()
    expected = whole.push(tokens)
    whole.finish()
    mapper = CodeMapper()
    out: list[Frame] = []
    for chunk in data.draw(_chunked(tokens)):
        out.extend(mapper.push(chunk))
    mapper.finish()
    assert out == expected
    assert (mapper.dropped_tokens, mapper.dropped_frames) == (
        whole.dropped_tokens,
        whole.dropped_frames,
    )
    assert 7 * len(out) + mapper.dropped_tokens == len(tokens)
    # every emitted frame re-encodes to 7 consecutive tokens of the input
    joined = ",".join(map(str, tokens))
    for frame in out:
        assert ",".join(map(str, frame_tokens(frame))) in joined


def test_prompt_layout() -> None:
    text_ids = [128000, 83, 5169, 25, 22691]  # as a Llama-3 tokenizer returns them (BOS first)
    assert prompt_ids(text_ids) == [128259, *text_ids, 128009, 128260, 128261, 128257]
    assert prompt_ids([]) == [128259, 128009, 128260, 128261, 128257]
    assert voice_text("tara", "Hi <laugh> there") == "tara: Hi <laugh> there"
