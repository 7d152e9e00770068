"""A session's segmentation: each context's policy, the audio it plans
with, and its timer (``docs/segmentation.md``).

The policy (``gateway.text.policy``, pure) decides when to cut the client's
text early from how much audio lies ahead of the listener; this module
builds a context's policy from the session's config and the engine, counts
that audio (``ahead_s``) and arms the policy's next check while no text
arrives (``arm_timer``: the session core's callback commits what the check
cuts).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.engines.base import Capabilities
from gateway.protocol import EffectiveConfig
from gateway.session.contexts import Context
from gateway.text.duration import estimate_seconds
from gateway.text.policy import LOAD_ALLOWANCE_S, PolicyConfig, SegmentPolicy
from gateway.text.segmenter import Segmenter

if TYPE_CHECKING:
    from gateway.settings import Settings


def new_policy(
    config: EffectiveConfig,
    settings: Settings,
    capabilities: Capabilities,
    segmenter: Segmenter | None = None,
) -> SegmentPolicy:
    """A context's policy for an utterance starting under ``config``
    (``segmenter``: the context's last one, kept if it still fits)."""
    if (
        segmenter is None
        or segmenter.granularity != config.split_granularity
        or segmenter.input_format != config.input_format
        or segmenter.markup_tags != capabilities.markup_tags
    ):
        # cuts keep the input format's constructs and the engine's tags whole
        segmenter = Segmenter(
            config.split_granularity,
            max_chars=settings.max_segment_chars,
            input_format=config.input_format,
            markup_tags=capabilities.markup_tags,
        )
    policy = PolicyConfig(
        # the engine's own time to first chunk, with room for load
        lead_s=capabilities.typical_first_chunk_s + LOAD_ALLOWANCE_S,
        first_min_words=settings.first_segment_min_words,
        min_words=settings.phrase_min_words,
        speed=config.speed,
    )
    # one WAV per segment without streamed audio: no early cuts there
    return SegmentPolicy(segmenter, policy, timed=config.stream_audio)


def ahead_s(ctx: Context, now: float) -> float:
    """Audio ahead of the context's listener: sent and unplayed, plus the
    estimated rest of every segment committed and not yet fully sent (read
    from the audio ledger)."""
    ahead = ctx.listener.ahead_s(now)
    for utt in ctx.open_utterances():
        for segment in utt.segments:
            if segment.audio.finished or utt.cancelled:
                continue
            estimate = estimate_seconds(segment.engine_text, utt.config.speed)
            audio = segment.audio
            sent = (utt.audio.sent_ms - audio.start_ms) / 1000 if audio.started else 0.0
            ahead += max(0.0, estimate - sent)
    return ahead


def arm_timer(ctx: Context, now: float, ahead: float, fire: Callable[[Context], None]) -> None:
    """(Re)arm the policy's next check of ``ctx`` while no text arrives:
    ``fire(ctx)`` then."""
    ctx.cancel_segment_timer()
    at = ctx.policy.next_check(now, ahead) if ctx.utterance is not None else None
    if at is not None:
        loop = asyncio.get_running_loop()
        ctx.segment_timer = loop.call_later(max(0.0, at - now), fire, ctx)
