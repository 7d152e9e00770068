"""Orpheus TTS special token ids and the prompt layout (pure, no tokenizer).

What this module is for: the ids an Orpheus model (a Llama-3 fine-tune with a
156,940-id vocabulary) uses around a turn, and the order a prompt puts them
in.  Text is tokenized elsewhere (``transformers``' tokenizer of the model):
this module only arranges ids, so it is testable without any model files.

The layout follows Orpheus' reference formatting: the tokenized
``"{voice}: {text}"`` (as the Llama-3 tokenizer returns it, which starts with
its own ``<|begin_of_text|>``; this module neither adds nor strips it) between
``<start_of_human>`` and ``<eot> <end_of_human> <start_of_ai>
<start_of_speech>``.  The model answers with audio tokens (see ``codes.py``)
and ``<end_of_speech>``.

What it must not do: tokenize, or know about HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

START_OF_TEXT: Final = 128000  #: Llama-3 ``<|begin_of_text|>``, added by the tokenizer
END_OF_TEXT: Final = 128009  #: ``<|eot_id|>``
START_OF_SPEECH: Final = 128257
END_OF_SPEECH: Final = 128258
START_OF_HUMAN: Final = 128259
END_OF_HUMAN: Final = 128260
START_OF_AI: Final = 128261
END_OF_AI: Final = 128262
#: the first audio token id (``<custom_token_10>``); see ``codes.py``
AUDIO_TOKEN_BASE: Final = 128266
#: the model's vocabulary size (Orpheus' config); audio ids end at 128266 + 7 x 4096 - 1 = 156937
VOCAB_SIZE: Final = 156940

#: the voices Orpheus' English fine-tune was trained on
VOICES: Final = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")

_PREFIX: Final = (START_OF_HUMAN,)
_SUFFIX: Final = (END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH)


def voice_text(voice: str, text: str) -> str:
    """The text the tokenizer is given for one segment: ``"{voice}: {text}"``.
    Emotion tags (``<laugh>``, ``<sigh>``) in ``text`` pass through as they are."""
    return f"{voice}: {text}"


def prompt_ids(text_ids: Sequence[int]) -> list[int]:
    """The prompt for one segment from its tokenized ``voice_text``:
    ``<start_of_human> text_ids <eot> <end_of_human> <start_of_ai> <start_of_speech>``."""
    return [*_PREFIX, *text_ids, *_SUFFIX]
