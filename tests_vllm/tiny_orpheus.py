"""A tiny Orpheus-shaped model, built at test time, that a real vLLM serves.

What this module is for: the orpheus engine's end-to-end tests need a real
vLLM generating real Orpheus audio tokens; the real model (3B, licensed
weights from a model hub) cannot be used here.  This builds a 1-layer Llama
with Orpheus' vocabulary (156,940 ids) and a Llama-3-layout tokenizer in a
folder, from a seed, in a few seconds; nothing is downloaded and nothing large
is committed.

Why a constructed model, not a trained or randomly initialised one.  A random
model rarely follows the 7-position audio layout; training one to do so costs
minutes of CPU.  Instead the weights are *set* so that the model follows a
fixed chain of tokens deterministically (no training, exactly known output):

- ``o_proj`` and ``down_proj`` are zero, so the attention and MLP branches add
  nothing and the last hidden state is the current token's embedding ``e_t``
  (q/k/v/gate/up keep small random weights: vLLM runs real attention and MLP
  kernels, whose results just do not reach the output);
- every embedding is a random unit vector (dimension 256), and the final
  RMSNorm's weight is ``1/sqrt(hidden)``, which maps a unit vector to itself;
- ``lm_head``'s row for ``successor(t)`` is ``scale * e_t`` (scale 100) and
  every other row is zero.  So the successor's logit is 100; another chain
  token's logit is ``100 <e_u, e_t>`` (random unit vectors in 256 dimensions:
  |cosine| below ≈ 0.3 over a chain this long), every other token's is 0.

The chain is ``<start_of_speech>`` (128257, the prompt's last token) -> the 7
audio tokens of frame 1 -> ... -> frame N -> ``<end_of_speech>`` (128258) ->
``<|eot_id|>`` (128009, the generation config's eos).  Frames are random
SNAC codes, distinct per position (sampled without replacement), so every
token of the chain occurs once and no two frames are equal; each token lies
in its position's id block (``codes.token_id``).  With Orpheus' sampling
(temperature 0.6, top_p 0.8, repetition_penalty 1.1) the successor still
carries all the probability (a margin of ≥ 70 logits / 0.6): the output is
the chain whatever the prompt, which is what the tests assert.

The tokenizer (built with ``tokenizers``): byte-level BPE (the 256 byte
symbols plus a handful of merges) padded with filler entries to 128,000 ids;
Llama-3's 256 special tokens at 128000..128255 (``<|begin_of_text|>`` 128000,
added before every encoding, ``<|eot_id|>`` 128009); Orpheus'
``<custom_token_N>`` at 128256 + N up to id 156939 (so ``<start_of_speech>``
is ``<custom_token_1>``).  Emotion tags such as ``<laugh>`` are plain text,
as in Orpheus' own tokenizer (byte-level: any text round-trips).  Saved with
``transformers``' ``PreTrainedTokenizerFast``, so ``AutoTokenizer`` and vLLM
both load it from the folder.

The folder is cached under ``.data-vllm/`` (git-ignored), keyed by the
builder's parameters and this file's hash, and written atomically.

What it must not do: download anything, or depend on vLLM (it runs in the
gateway's virtualenv; vLLM only reads the folder).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch

from gateway.engines.orpheus.codes import FRAME_TOKENS, Frame, frame_tokens
from gateway.engines.orpheus.tokens import (
    END_OF_SPEECH,
    END_OF_TEXT,
    START_OF_SPEECH,
    START_OF_TEXT,
    VOCAB_SIZE,
)

HIDDEN: Final = 256
HEADS: Final = 4
HEAD_DIM: Final = 64  # vLLM's CPU attention needs a head size of at least 32
INTERMEDIATE: Final = 512
SCALE: Final = 100.0
#: the text vocabulary ends where Llama-3's special tokens start
TEXT_VOCAB: Final = 128000
SPECIAL_BASE: Final = 128000
SPECIAL_COUNT: Final = 256
CUSTOM_BASE: Final = SPECIAL_BASE + SPECIAL_COUNT  # 128256 = <custom_token_0>
#: room for the orpheus engine's default max_tokens cap (8192) plus a prompt
MAX_MODEL_LEN: Final = 16384

_REPO_ROOT: Final = Path(__file__).resolve().parent.parent
CACHE_DIR: Final = Path(os.environ.get("TINY_ORPHEUS_CACHE", _REPO_ROOT / ".data-vllm"))

#: Llama-3's named special tokens; the rest of 128000..128255 are reserved
_LLAMA3_SPECIALS: Final = {
    128000: "<|begin_of_text|>",
    128001: "<|end_of_text|>",
    128006: "<|start_header_id|>",
    128007: "<|end_header_id|>",
    128008: "<|eom_id|>",
    128009: "<|eot_id|>",
}


def special_token(token_id: int) -> str:
    """The name of a special id (Llama-3's 128000..128255, Orpheus' above)."""
    if SPECIAL_BASE <= token_id < CUSTOM_BASE:
        return _LLAMA3_SPECIALS.get(
            token_id, f"<|reserved_special_token_{token_id - SPECIAL_BASE}|>"
        )
    if CUSTOM_BASE <= token_id < VOCAB_SIZE:
        return f"<custom_token_{token_id - CUSTOM_BASE}>"
    raise ValueError(f"{token_id} is not a special id")


@dataclass(frozen=True)
class TinyOrpheus:
    """A built model folder and the output it generates."""

    folder: Path
    #: the SNAC frames the model speaks, in order
    frames: tuple[Frame, ...]
    #: the ids it generates after ``<start_of_speech>``: the frames' audio
    #: tokens, then ``<end_of_speech>`` (then ``<|eot_id|>`` if not stopped)
    chain: tuple[int, ...]

    @property
    def audio_ids(self) -> tuple[int, ...]:
        """The audio tokens alone (the chain without ``<end_of_speech>``)."""
        return self.chain[: len(self.frames) * FRAME_TOKENS]


def chain_frames(seed: int, count: int) -> list[Frame]:
    """``count`` random SNAC frames, codes distinct per position."""
    rng = random.Random(seed)
    columns = [rng.sample(range(4096), count) for _ in range(FRAME_TOKENS)]
    return [
        (
            columns[0][i],
            columns[1][i],
            columns[2][i],
            columns[3][i],
            columns[4][i],
            columns[5][i],
            columns[6][i],
        )
        for i in range(count)
    ]


def _chain(frames: list[Frame]) -> list[int]:
    audio = [tid for frame in frames for tid in frame_tokens(frame)]
    return [*audio, END_OF_SPEECH]


def _key(seed: int, frames: int) -> str:
    source = Path(__file__).read_bytes()
    digest = hashlib.sha256(source + f"|{seed}|{frames}".encode()).hexdigest()
    return f"tiny-orpheus-s{seed}-f{frames}-{digest[:12]}"


def build(seed: int = 15, frames: int = 60, cache: Path | None = None) -> TinyOrpheus:
    """The model folder for ``seed`` and ``frames`` (built once, then cached)."""
    if frames < 1:
        raise ValueError("frames must be at least 1")
    codes = chain_frames(seed, frames)
    chain = _chain(codes)
    root = cache if cache is not None else CACHE_DIR
    folder = root / _key(seed, frames)
    if not (folder / "model.safetensors").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        try:
            _write_model(tmp, seed, chain)
            _write_tokenizer(tmp)
            try:
                tmp.rename(folder)
            except OSError:  # built meanwhile by another process
                if not (folder / "model.safetensors").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return TinyOrpheus(folder=folder, frames=tuple(codes), chain=tuple(chain))


def _write_model(folder: Path, seed: int, chain: list[int]) -> None:
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16
    embed = torch.randn(VOCAB_SIZE, HIDDEN, generator=gen)
    embed /= embed.norm(dim=1, keepdim=True)
    lm_head = torch.zeros(VOCAB_SIZE, HIDDEN)
    # current token -> successor; after <end_of_speech> comes the eos
    sequence = [START_OF_SPEECH, *chain, END_OF_TEXT]
    for current, successor in itertools.pairwise(sequence):
        lm_head[successor] = SCALE * embed[current]

    def small(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen) * 0.02).to(dtype)

    layer = "model.layers.0."
    tensors = {
        "model.embed_tokens.weight": embed.to(dtype),
        layer + "input_layernorm.weight": torch.ones(HIDDEN, dtype=dtype),
        layer + "self_attn.q_proj.weight": small(HEADS * HEAD_DIM, HIDDEN),
        layer + "self_attn.k_proj.weight": small(HEADS * HEAD_DIM, HIDDEN),
        layer + "self_attn.v_proj.weight": small(HEADS * HEAD_DIM, HIDDEN),
        # zero: attention adds nothing to the residual stream
        layer + "self_attn.o_proj.weight": torch.zeros(HIDDEN, HEADS * HEAD_DIM, dtype=dtype),
        layer + "post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=dtype),
        layer + "mlp.gate_proj.weight": small(INTERMEDIATE, HIDDEN),
        layer + "mlp.up_proj.weight": small(INTERMEDIATE, HIDDEN),
        # zero: the MLP adds nothing either
        layer + "mlp.down_proj.weight": torch.zeros(HIDDEN, INTERMEDIATE, dtype=dtype),
        # RMSNorm of a unit vector is sqrt(HIDDEN) times it; this undoes that
        "model.norm.weight": torch.full((HIDDEN,), HIDDEN**-0.5, dtype=dtype),
        "lm_head.weight": lm_head.to(dtype),
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_MODEL_LEN,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": START_OF_TEXT,
        "eos_token_id": END_OF_TEXT,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": START_OF_TEXT, "eos_token_id": END_OF_TEXT}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


#: a few merges, so common text takes fewer tokens than bytes
_MERGES: Final = (("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("e", "r"), ("l", "l"), ("o", "r"))


def _write_tokenizer(folder: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab: dict[str, int] = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    for left, right in _MERGES:
        vocab[left + right] = len(vocab)
    filler = 0
    while len(vocab) < TEXT_VOCAB:
        vocab[f"<|filler_{filler}|>"] = len(vocab)
        filler += 1
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=list(_MERGES)))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    specials = [
        AddedToken(special_token(i), special=True, normalized=False)
        for i in range(SPECIAL_BASE, VOCAB_SIZE)
    ]
    tokenizer.add_special_tokens(specials)  # type: ignore[arg-type]
    bos = special_token(START_OF_TEXT)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, START_OF_TEXT)]
    )
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise AssertionError(f"tokenizer has {tokenizer.get_vocab_size()} ids, not {VOCAB_SIZE}")
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=special_token(END_OF_TEXT),
        pad_token=special_token(128004),
        model_max_length=MAX_MODEL_LEN,
    )
    fast.save_pretrained(str(folder))
