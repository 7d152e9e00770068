"""The report of a cancel: a pure function of what was sent and heard.

For each cancelled utterance, in order: ``audio.cancelled`` (how much was
sent and heard, the text split into spoken and unspoken), then
``audio.done`` for the segment that was open when the audio stopped (if
it belongs to that utterance) and ``session.done``, all marked
``cancelled: true``.  No I/O, no clock: the caller passes the listener's
position (``gateway.flow.listener.Listener.position``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway import protocol
from gateway.session.utterance import Segment, Utterance


def heard_position(utt: Utterance, context_position_ms: float) -> float:
    """The listener's position inside ``utt``: the context's position less
    where the utterance started, never beyond what was sent."""
    return min(utt.audio.sent_ms, max(0.0, context_position_ms - utt.flow_offset_ms))


def cancel_report(
    context_id: str | None,
    utterances: Sequence[Utterance],
    context_position_ms: float,
    source: protocol.PositionSource,
    open_segment: Segment | None = None,
    sent_bytes: int = 0,
) -> list[protocol.ServerMessage]:
    """The messages reporting these cancelled utterances of one context.

    ``open_segment`` is the segment whose audio was cut (its
    ``audio.start`` went out, its ``audio.done`` did not) and ``sent_bytes``
    the payload bytes of it sent so far."""
    messages: list[protocol.ServerMessage] = []
    for utt in utterances:
        position = heard_position(utt, context_position_ms)
        spoken, unspoken = utt.heard_split(position, utt.unsent_text)
        messages.append(
            protocol.AudioCancelled(
                context_id=context_id,
                utterance_index=utt.index,
                sent_ms=round(utt.audio.sent_ms, 3),
                played_ms=round(position, 3),
                position_source=source,
                spoken_text=spoken,
                unspoken_text=unspoken,
            )
        )
        if open_segment is not None and open_segment in utt.segments:
            messages.append(
                protocol.AudioDone(
                    context_id=context_id,
                    utterance_index=utt.index,
                    sentence_index=open_segment.index,
                    total_bytes=sent_bytes,
                    audio_ms=round(utt.audio.sent_ms - open_segment.audio.start_ms, 3),
                    cancelled=True,
                )
            )
        messages.append(utt.session_done(context_id, cancelled=True))
    return messages
