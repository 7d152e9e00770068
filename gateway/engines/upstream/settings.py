"""``[upstream]``: the upstream engine's settings section, a replica pool's
fields (``pool.settings.PoolSettings``) and the relay's own.

This module does no I/O.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from gateway.engines.pool.settings import PoolSettings
from gateway.engines.section import check


class UpstreamSettings(PoolSettings, forbid_unknown_fields=True, kw_only=True):
    """``[upstream]``: the ``upstream`` engine's pool of OpenAI-compatible
    speech servers (``docs/engine.md``, ``docs/deployment.md``); the pool's
    fields are ``PoolSettings``'."""

    SECTION: ClassVar[str] = "upstream"

    #: the upstream's output rate in Hz; 0: read from a WAV header at start
    native_rate: int = 0
    response_format: Literal["pcm", "wav"] = "pcm"
    stream_format: Literal["audio", "sse"] = "audio"
    #: voices to list when the upstream has no ``GET /v1/audio/voices`` (OpenAI)
    voices: list[str] = msgspec.field(default_factory=list)
    #: BCP-47 tags the upstream's voices speak (first: its voices' language)
    languages: list[str] = msgspec.field(default_factory=lambda: ["en-US"])
    #: the upstream honours ``instructions`` (passed through when set)
    instructions: bool = False
    #: the upstream clones from ``ref_audio``/``ref_text`` (passed through)
    cloning: bool = False
    #: the upstream honours ``speed`` on a streamed request (a vllm-omni model
    #: with native speed control); vllm-omni 0.30 refuses any other speed
    #: than 1.0 on a stream, so without it ``speed`` is ``unsupported_option``
    stream_speed: bool = False
    #: the upstream takes vllm-omni 0.30's ``seed`` (another gateway; a
    #: vllm-omni model): forwarded, and the engine declares ``seed``
    seed: bool = False
    #: the upstream gives vllm-omni 0.30's ``X-Word-Timestamps`` on a whole
    #: file (another gateway; vllm-omni launched with ``--forced-aligner``):
    #: a segment whose stream asks for word timings is then one whole-file
    #: request (``stream: false``, ``word_timestamps: true``), not a stream
    word_timestamps: bool = False
    #: send ``language`` with each request (vllm-omni's Qwen3-TTS takes it)
    send_language: bool = False
    #: send ``sample_rate`` (the voice's native rate) so the upstream does not
    #: resample (this gateway takes it; OpenAI and vllm-omni do not)
    send_sample_rate: bool = False
    #: audio one segment may have: ``max_audio_base_s + max_audio_s_per_char
    #: x characters``, divided by ``speed``; beyond it the segment fails
    #: (an upstream that speaks on, or an endless body)
    max_audio_base_s: float = 5.0
    max_audio_s_per_char: float = 0.25
    #: after the first byte, seconds of audio per second of reading (time
    #: waiting for the listener's room not counted) below which the segment
    #: fails, once ``min_delivery_grace_s`` has passed; 0 turns it off
    min_delivery_rate: float = 0.5
    min_delivery_grace_s: float = 2.0
    #: the most engine text (characters) one request carries: a longer
    #: segment is several requests, one after another, cut at clause, then
    #: word boundaries (bounded work per item, ``docs/engine.md``)
    max_item_chars: int = 600

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            [
                (
                    self.native_rate == 0 or 8000 <= self.native_rate <= 192_000,
                    "upstream.native_rate must be 0 or 8000 to 192000",
                ),
                (bool(self.languages), "upstream.languages must not be empty"),
                (self.max_audio_base_s > 0, "upstream.max_audio_base_s must be > 0"),
                (self.max_audio_s_per_char > 0, "upstream.max_audio_s_per_char must be > 0"),
                (self.min_delivery_rate >= 0, "upstream.min_delivery_rate must be >= 0"),
                (self.min_delivery_grace_s >= 0, "upstream.min_delivery_grace_s must be >= 0"),
                (self.max_item_chars >= 50, "upstream.max_item_chars must be >= 50"),
            ]
        )
