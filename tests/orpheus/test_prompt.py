"""The prompt of a segment, built with a real tokenizer loaded offline by
``transformers.AutoTokenizer`` from a folder written here (a small byte-level
BPE made with ``tokenizers``; nothing downloaded), the ``max_tokens``
formula and the item bound it gives (``item_chars``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.engines.orpheus.prompt import (
    PROMPT_TOKENS,
    PromptBuilder,
    TokenizerError,
    item_chars,
    max_tokens,
    speech_tokens,
)
from gateway.engines.orpheus.tokens import (
    END_OF_HUMAN,
    END_OF_TEXT,
    START_OF_AI,
    START_OF_HUMAN,
    START_OF_SPEECH,
)

BOS = "<|begin_of_text|>"


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    merges = [("t", "a"), ("ta", "r")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(BOS, special=True, normalized=False)])
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, bos_id)]
    )
    folder = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS).save_pretrained(str(folder))
    return folder


def test_the_prompt_layout(tokenizer_folder: Path) -> None:
    builder = PromptBuilder.load(tokenizer_folder)
    ids = builder.ids("tara", "Hello there.")
    text_ids = builder.tokenizer("tara: Hello there.")["input_ids"]
    suffix = [END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]
    assert ids == [START_OF_HUMAN, *text_ids, *suffix]
    bos = builder.tokenizer.convert_tokens_to_ids(BOS)
    assert ids[1] == bos  # the tokenizer's own <|begin_of_text|>, once
    assert ids.count(bos) == 1
    assert builder.tokenizer.decode(ids[2:-4]) == "tara: Hello there."


def test_emotion_tags_pass_through_as_text(tokenizer_folder: Path) -> None:
    builder = PromptBuilder.load(tokenizer_folder)
    ids = builder.ids("leo", "Well <laugh> that was <sigh> something.")
    assert builder.tokenizer.decode(ids[2:-4]) == "leo: Well <laugh> that was <sigh> something."


def test_missing_or_empty_tokenizer_folders_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="is not a folder"):
        PromptBuilder.load(tmp_path / "absent")
    with pytest.raises(TokenizerError, match="no tokenizer could be read"):
        PromptBuilder.load(tmp_path)


@pytest.mark.parametrize(
    ("chars", "expected"),
    [
        (0, 140),  # the base alone: 20 frames, 1.7 s
        (1, 140 + 7 * 2),  # 0.15 s = 1.76 frames -> 2
        (100, 140 + 7 * 176),  # 15 s = 175.8 frames -> 176
        (300, 140 + 7 * 528),  # the longest default segment: 45 s
        (10_000, 8192),  # the cap
    ],
)
def test_max_tokens_formula(chars: int, expected: int) -> None:
    assert max_tokens(chars, 0.15, 140, 8192) == expected


def test_max_tokens_grows_with_the_text_and_covers_a_slow_speaker() -> None:
    previous = 0
    for chars in range(0, 400, 7):
        limit = max_tokens(chars, 0.15, 140, 100_000)
        assert limit >= previous and limit % 7 == 0
        previous = limit
        # a slow speaker (0.1 s per character) fits with room to spare
        assert limit >= 7 * (chars * 0.1 * 24000 / 2048)


@pytest.mark.parametrize(
    ("limit", "context", "spc", "cap", "expected"),
    [
        (600, None, 0.15, 8192, 600),  # the default: 7,525 tokens, within the cap
        (600, 16384, 0.15, 8192, 600),
        (600, 8192, 0.15, 8192, 600),  # 7,525 + 600 + 32 = 8,157: fits
        (600, 4096, 0.15, 8192, 294),
        (600, 2048, 0.15, 8192, 140),  # vLLM serving with --max-model-len 2048
        (600, 300, 0.15, 8192, 50),  # no usable context: the floor
        (600, None, 0.2, 8192, 490),  # a slower pace: the cap would cut 600
        (600, None, 0.15, 4096, 321),  # a lower cap
        (50, 100, 0.15, 8192, 50),  # the floor is the limit where that is lower
        (60, 100, 0.15, 8192, 50),
    ],
)
def test_item_chars_keeps_an_item_within_the_cap_and_the_context(
    limit: int, context: int | None, spc: float, cap: int, expected: int
) -> None:
    got = item_chars(limit, context, spc, 140, cap)
    assert got == expected
    if got > 50:  # above the floor, the largest that fits
        for chars, fits in ((got, True), (got + 1, False)):
            tokens = speech_tokens(chars, spc, 140)
            within = tokens <= cap and (
                context is None or tokens + chars + PROMPT_TOKENS <= context
            )
            assert within is fits or (chars > limit and not fits)
