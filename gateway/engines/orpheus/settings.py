"""``[orpheus]``: the orpheus engine's settings section, a replica pool's
fields (``pool.settings.PoolSettings``), the local tokenizer and SNAC
weights, sampling and the decoder.  What the host must have (the extra, the
folders, a GPU) is checked when the engine is created
(``engine.check_setup``), not here.

This module does no I/O.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from gateway.engines.orpheus.tokens import VOICES as ORPHEUS_VOICES
from gateway.engines.pool.settings import PoolSettings
from gateway.engines.section import check


class OrpheusSettings(PoolSettings, forbid_unknown_fields=True, kw_only=True):
    """``[orpheus]``: the ``orpheus`` engine (``docs/engine.md``): a pool of
    vLLM servers serving an Orpheus model (``PoolSettings``' fields), the
    local tokenizer and SNAC weights, sampling and the decoder."""

    SECTION: ClassVar[str] = "orpheus"
    URLS_ARE: ClassVar[str] = ", the vLLM servers"

    #: vLLM answers ``/health`` and ``/v1/models``
    ready_paths: list[str] = msgspec.field(default_factory=lambda: ["/v1/models"])
    #: vLLM lists no voices (the model's are ``voices`` below)
    voices_path: str = ""
    #: folder of the model's tokenizer (``tokenizer.json`` ...), read by
    #: ``transformers.AutoTokenizer`` offline: the model folder or a copy
    tokenizer: str = ""
    #: folder of the SNAC 24 kHz weights (``config.json``, ``pytorch_model.bin``)
    snac: str = ""
    #: where SNAC decodes
    device: Literal["cpu", "cuda"] = "cpu"
    #: SNAC's noise blocks: ``keyed`` to the sample position (production) or ``off``
    noise: Literal["keyed", "off"] = "keyed"
    #: the model's voices, default first (the prompt is ``"{voice}: {text}"``)
    voices: list[str] = msgspec.field(default_factory=lambda: list(ORPHEUS_VOICES))
    #: BCP-47 tag of the voices' language
    language: str = "en-US"
    temperature: float = 0.6
    top_p: float = 0.8
    repetition_penalty: float = 1.1
    #: sent as ``seed`` with each request when set (reproducible sampling: tests)
    seed: int | None = None
    #: ``max_tokens = max_tokens_base + ceil(chars x seconds_per_char x 7 x 24000 / 2048)``
    #: (7 tokens per 85.3 ms frame), capped at ``max_tokens_cap``: a runaway
    #: generation ends instead of speaking on
    seconds_per_char: float = 0.15
    max_tokens_base: int = 140
    max_tokens_cap: int = 8192
    #: bounded work per item: the most engine text (characters) one
    #: completion carries; a longer segment is several completions, one after
    #: another, decoded as one stream (``docs/engine.md``, "Bounded work per
    #: item").  600, twice ``max_segment_chars``: ordinary text is never cut,
    #: and its ``max_tokens`` (7,525) fits under ``max_tokens_cap`` and, with
    #: its prompt, in an 8,192-token context.  Lowered where the cap or the
    #: served model's context would cut an item this long (``prompt.item_chars``)
    max_item_chars: int = 600
    #: decoded frames a segment may hold that wait for the listener's room
    #: (bounds memory for a stalled listener; the HTTP read pauses beyond it)
    max_pending_frames: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            [
                (bool(self.voices), "orpheus.voices must not be empty"),
                (self.temperature >= 0, "orpheus.temperature must be >= 0"),
                (0 < self.top_p <= 1, "orpheus.top_p must be in (0, 1]"),
                (self.repetition_penalty > 0, "orpheus.repetition_penalty must be > 0"),
                (self.seconds_per_char > 0, "orpheus.seconds_per_char must be > 0"),
                (self.max_tokens_base >= 7, "orpheus.max_tokens_base must be >= 7"),
                (
                    self.max_tokens_cap >= self.max_tokens_base,
                    "orpheus.max_tokens_cap must be >= max_tokens_base",
                ),
                (self.max_pending_frames >= 1, "orpheus.max_pending_frames must be >= 1"),
                (self.max_item_chars >= 50, "orpheus.max_item_chars must be >= 50"),
            ]
        )
