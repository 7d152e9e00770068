"""``[piper]``: the Piper engine's settings section (``gateway.engines.section``).

This module does no I/O and imports nothing heavy: ``gateway.settings``
reads it at start, whatever the engine.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from gateway.engines.section import Section, check


class PiperSettings(Section, forbid_unknown_fields=True, kw_only=True):
    """``[piper]``: the Piper engine (``GATEWAY_PIPER_<FIELD>``)."""

    SECTION: ClassVar[str] = "piper"
    #: Piper's fields were flat once (``device``, ``GATEWAY_DEVICE``)
    FLAT_ALIASES: ClassVar[tuple[str, ...]] = (
        "voices",
        "device",
        "onnx_provider",
        "deterministic",
        "chunk_schedule",
        "acoustic_threads",
        "vocoder_threads",
    )

    #: extra Piper voices: paths to ``.onnx`` files (``.onnx.json`` beside them)
    voices: list[str] = msgspec.field(default_factory=list)
    #: torch device for the vocoder: ``auto`` picks CUDA when available
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: onnxruntime providers for acoustic models: ``auto`` adds CUDA when the
    #: ``onnxruntime-gpu`` package is installed
    onnx_provider: Literal["auto", "cpu", "cuda"] = "auto"
    #: noise scales forced to 0, thread counts and chunk sizes fixed whatever
    #: the load: identical input gives identical audio (tests)
    deterministic: bool = False
    #: decoder chunk sizes in latent frames (first, second, ... then the last
    #: value repeats): a small first chunk for latency, larger ones after
    chunk_schedule: list[int] = msgspec.field(default_factory=lambda: [16, 32, 64])
    #: threads for the acoustic model and for the vocoder (0: every core, up to
    #: 4, while the other pool is idle, one while it works)
    acoustic_threads: int = 0
    vocoder_threads: int = 0
    #: the most phonemes one acoustic call reads (bounded work per item,
    #: ``docs/engine.md``): a segment whose engine text phonemizes to more is
    #: spoken as pieces cut at clause, then word boundaries
    max_item_phonemes: int = 200

    def __post_init__(self) -> None:
        check(
            [
                (bool(self.chunk_schedule), "piper.chunk_schedule must not be empty"),
                (
                    all(c >= 1 for c in self.chunk_schedule),
                    "piper.chunk_schedule values must be >= 1",
                ),
                (self.acoustic_threads >= 0, "piper.acoustic_threads must be >= 0"),
                (self.vocoder_threads >= 0, "piper.vocoder_threads must be >= 0"),
                (self.max_item_phonemes >= 50, "piper.max_item_phonemes must be >= 50"),
            ]
        )
