"""The events about one segment's audio, as the WebSocket client hears them:
pure functions of the segment's records.

``audio.start`` (after the ``error`` of a refused segment), ``alignment``
and ``audio.done`` (after the ``error`` of a failed one).  The audio stream
sends them in order with the segment's frames; it writes the ledger
(``gateway.session.ledger``) first, so each reads the positions it must
carry.  No I/O, no clock, no writes.
"""

from __future__ import annotations

from gateway import protocol
from gateway.errors import BUSY_RETRY_AFTER_S, ErrorCode, GatewayError
from gateway.session.contexts import Context
from gateway.session.utterance import Segment, Utterance
from gateway.text.stage import SourceWord


def audio_start(ctx: Context, utt: Utterance, segment: Segment) -> list[protocol.ServerMessage]:
    """``audio.start``: the segment's audio begins; a refused segment
    (malformed SSML, over the engine-text budget) is reported before it,
    and not spoken."""
    config = utt.config
    messages: list[protocol.ServerMessage] = []
    if segment.refused is not None:
        problem = segment.refused
        messages.append(
            protocol.Error(
                code=problem.code,
                message=f"sentence {segment.index} is not spoken: {problem.message}",
                context_id=ctx.id,
                action="sentence_skipped",
            )
        )
    return [
        *messages,
        protocol.AudioStart(
            context_id=ctx.id,
            utterance_index=utt.index,
            sentence_index=segment.index,
            sentence_text=segment.text,
            format=config.response_format,
            encoding=config.encoding,
            sample_rate=config.sample_rate,
            context_number=ctx.number,
            engine_text=segment.engine_text if config.debug_engine_text else None,
        ),
    ]


def alignment(
    ctx: Context, utt: Utterance, segment: Segment, mapped: tuple[SourceWord, ...]
) -> list[protocol.ServerMessage]:
    """``alignment`` of newly timed words (``mapped``), in utterance time on
    the client's words, if the client asked for timestamps."""
    if not utt.config.timestamps or not mapped:
        return []  # (a later piece's words all inside a client word timed already)
    start_ms = segment.audio.start_ms
    return [
        protocol.Alignment(
            context_id=ctx.id,
            utterance_index=utt.index,
            sentence_index=segment.index,
            # on the client's words, with their offsets in its text
            words=[
                protocol.WordTimestamp(
                    word=w.text,
                    start_ms=round(start_ms + w.start_ms, 1),
                    end_ms=round(start_ms + w.end_ms, 1),
                    char_start=segment.source_start + w.char_start,
                    char_end=segment.source_start + w.char_end,
                )
                for w in mapped
            ],
        )
    ]


def audio_done(
    ctx: Context, utt: Utterance, segment: Segment, failure: GatewayError | None
) -> list[protocol.ServerMessage]:
    """``audio.done`` (``error: true`` after the ``error`` of a failed
    segment, whose code the stream chose: the engine's, or ``internal``)."""
    sent_bytes = segment.audio.sent_bytes
    messages: list[protocol.ServerMessage] = []
    if failure is not None:
        messages.append(
            protocol.Error(
                code=failure.code,
                message=failure.message,
                context_id=ctx.id,
                partial_audio=sent_bytes > 0,
                # vllm-omni 0.30's word when part of the sentence's audio
                # went out: drop it; the utterance goes on either way
                action="discard" if sent_bytes > 0 else "sentence_skipped",
                retry_after_ms=(
                    BUSY_RETRY_AFTER_S * 1000 if failure.code is ErrorCode.BUSY else None
                ),
            )
        )
    messages.append(utt.audio_done(ctx.id, segment, sent_bytes, error=failure is not None))
    return messages
