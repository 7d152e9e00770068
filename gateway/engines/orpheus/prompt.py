"""One segment's prompt for an Orpheus model, and how many tokens it may take.

What this module is for: turning ``(voice, text)`` into the token ids sent to
vLLM as the completion's ``prompt``, with the model's own tokenizer
(``transformers.AutoTokenizer`` from a local folder: the model's folder or a
copy of its tokenizer files; nothing is downloaded), and the ``max_tokens``
bound that ends a runaway generation.

Prompt layout (``tokens.prompt_ids``): ``<start_of_human>``, the tokenized
``"{voice}: {text}"`` (with the tokenizer's own ``<|begin_of_text|>``),
``<eot> <end_of_human> <start_of_ai> <start_of_speech>``.  Emotion tags
(``<laugh>``, ``<sigh>``, ...) are plain text to the tokenizer, as in
Orpheus' own formatting.

``max_tokens``: speech takes about 0.06-0.1 s per character of English text;
the bound allows ``seconds_per_char`` (default 0.15 s, about 1.5-2.5 times a
normal pace) plus a fixed ``max_tokens_base`` (default 140 tokens = 20 frames
= 1.7 s, for pauses and tags), at 7 tokens per 2048-sample frame of 24 kHz
audio, and never more than ``max_tokens_cap``::

    max_tokens = min(cap, base + 7 * ceil(chars * seconds_per_char * 24000 / 2048))

So a 100-character sentence may run to 140 + 7 * 176 = 1372 tokens (15 s of
audio) before vLLM stops it (``finish_reason: "length"``).

``item_chars``: the most characters one completion may carry (bounded work
per item): ``orpheus.max_item_chars``, lowered where ``max_tokens_cap`` or
the served model's context (vLLM's ``max_model_len``) would cut the speech
of that many characters: their ``max_tokens`` before the cap must be within
the cap, and the prompt and ``max_tokens`` within the context.  The prompt
is counted as at most one token per character plus ``PROMPT_TOKENS``
(English text tokenizes to about one token per four characters).  So an
item within the bound is never cut short by either.

What it must not do: run on the event loop for long texts (the engine calls
``PromptBuilder.ids`` in a worker thread), or know about HTTP.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gateway.engines.orpheus.codes import FRAME_TOKENS, SAMPLE_RATE, SAMPLES_PER_FRAME
from gateway.engines.orpheus.tokens import prompt_ids, voice_text

#: the prompt's tokens besides its text's: the special tokens of the layout,
#: ``<|begin_of_text|>`` and ``"{voice}: "`` (with room for a long voice name)
PROMPT_TOKENS = 32
#: the fewest characters an item bound goes down to for a short context
#: (below it ``max_tokens`` is cut by the context instead)
MIN_ITEM_CHARS = 50


class TokenizerError(RuntimeError):
    """The tokenizer folder cannot be used."""


def speech_tokens(chars: int, seconds_per_char: float, base: int) -> int:
    """``max_tokens`` of ``chars`` characters before the cap (see above)."""
    seconds = max(0, chars) * seconds_per_char
    frames = math.ceil(seconds * SAMPLE_RATE / SAMPLES_PER_FRAME)
    return base + FRAME_TOKENS * frames


def max_tokens(chars: int, seconds_per_char: float, base: int, cap: int) -> int:
    """The generation bound of a segment of ``chars`` characters (see above)."""
    return min(cap, speech_tokens(chars, seconds_per_char, base))


def item_chars(
    limit: int, context_len: int | None, seconds_per_char: float, base: int, cap: int
) -> int:
    """The most characters one completion carries: ``limit``, or less where
    ``cap`` would cut the speech of that many characters or ``context_len``
    (None: not known) cannot hold their prompt and ``max_tokens``; never
    under ``MIN_ITEM_CHARS`` (or ``limit``, if that is lower)."""

    def fits(chars: int) -> bool:
        tokens = speech_tokens(chars, seconds_per_char, base)
        if tokens > cap:
            return False
        return context_len is None or tokens + chars + PROMPT_TOKENS <= context_len

    floor = min(limit, MIN_ITEM_CHARS)
    low, high = floor, limit  # the largest n in [floor, limit] that fits, else floor
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


class PromptBuilder:
    """The model's tokenizer and the prompt layout.  ``ids`` is thread-safe
    (the fast tokenizers' encode is)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, folder: Path) -> PromptBuilder:
        """``AutoTokenizer`` from ``folder``, offline; a clear error if the
        folder or ``transformers`` is missing."""
        if not folder.is_dir():
            raise TokenizerError(f"orpheus.tokenizer: {folder} is not a folder")
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise TokenizerError(
                "the orpheus engine needs the `orpheus` extra (transformers, snac):"
                " pip install 'voice-gateway[orpheus]'"
            ) from exc
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise TokenizerError(
                f"orpheus.tokenizer: no tokenizer could be read from {folder}"
                f" ({type(exc).__name__}); it needs tokenizer.json or the model's tokenizer files"
            ) from exc
        return cls(tokenizer)

    def ids(self, voice: str, text: str) -> list[int]:
        """The prompt's token ids for one segment."""
        encoded = self.tokenizer(voice_text(voice, text))["input_ids"]
        return prompt_ids([int(i) for i in encoded])
