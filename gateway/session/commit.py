"""Committing the client's text: the segmentation policy's cuts become
segments, read by the text front-end and handed to the audio streams.

Text is cut when it arrives (``push``; while the utterance waits at the
door it is held unread, and cut when the door lets the session in), when
the policy's timer fires while no text arrives (``docs/segmentation.md``;
an early cut commits text only while the session may be admitted:
otherwise the text waits in the segmenter for more text, a flush or a free
slot) and at ``input.flush`` / ``input.done`` (``flush``).  Each
committed segment is read by the front-end (``gateway.session.reading``)
and goes to its context's stream, or waits with its utterance for the door
or the session's share (``gateway.session.door``).  No I/O beyond the timer
and the readings.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.flow.admission import Ticket
from gateway.session import reading, segmentation
from gateway.session.audio_stream import AudioStream, QueuedSegment
from gateway.session.contexts import Context
from gateway.session.door import SessionDoor


class Committer:
    def __init__(
        self,
        door: SessionDoor,
        stream_for: Callable[[Context], AudioStream],
        is_open: Callable[[], bool],
        holder: object,
        slot_decided: Callable[[Ticket], None],
    ) -> None:
        self.door = door
        #: the stream speaking a context's audio (``Session._stream_for``)
        self._stream_for = stream_for
        #: the session is ``OPEN`` (a timer firing later commits nothing otherwise)
        self._is_open = is_open
        #: what the admission gate holds as the session, and its ticket's listener
        self._holder = holder
        self._slot_decided = slot_decided

    def push(self, ctx: Context, text: str) -> None:
        """``text`` of the context's open utterance arrived (already accepted).

        While the utterance waits at the server's door its text is held
        unread (``SegmentPolicy.hold``): a crowd of sessions waiting to be
        let in or refused costs the event loop no segmentation, planning or
        reading beside the sessions speaking; ``let_in`` cuts it."""
        now = time.monotonic()
        if self.door.at_door(ctx.utterance):
            ctx.policy.hold(text, now)
            ctx.cancel_segment_timer()
            return
        cuts = ctx.policy.push(text, now, segmentation.ahead_s(ctx, now))
        self.commit(ctx, [c.text for c in cuts])
        self.arm_timer(ctx, now)

    def let_in(self, ctx: Context) -> None:
        """The door let the session in: the context's held text is cut now
        (as one increment) and its timer armed again."""
        if ctx.policy.holding and ctx.utterance is not None:
            self.push(ctx, "")

    def flush(self, ctx: Context) -> None:
        """``input.flush`` / ``input.done``: the rest of the segmenter's text."""
        ctx.cancel_segment_timer()
        self.commit(ctx, [c.text for c in ctx.policy.flush()])

    def arm_timer(self, ctx: Context, now: float) -> None:
        ahead = segmentation.ahead_s(ctx, now)
        segmentation.arm_timer(ctx, now, ahead, self._fire)

    def _fire(self, ctx: Context) -> None:
        ctx.segment_timer = None
        if self._is_open() and ctx.utterance is not None:
            now = time.monotonic()
            ahead = segmentation.ahead_s(ctx, now)
            # an early cut commits text: without a slot for it, the text
            # waits in the segmenter (for more text, a flush or a free slot)
            if self.door.refusal() is None:
                self.commit(ctx, [c.text for c in ctx.policy.poll(now, ahead)])
            self.arm_timer(ctx, now)

    def commit(self, ctx: Context, texts: list[str]) -> None:
        """Commit segments of the client's text: the front-end reads each;
        it goes to the context's stream, or waits with its utterance for the
        door or the session's share."""
        utt = ctx.utterance
        if not texts or utt is None:
            return
        self.door.take(ctx, utt, self._holder, self._slot_decided)
        stream = self._stream_for(ctx)
        waiting = self.door.waiting.get(utt)
        for text in texts:
            segment = utt.add_segment(text)
            if utt.ready_at is None:
                utt.ready_at = time.monotonic()  # a slot wait counts in first_audio_ms
            item = QueuedSegment(ctx, utt, segment)
            reading.read(item, stream.read_done)  # the front-end reads it, slot or not
            if waiting is not None:
                waiting[1].append(item)
            else:
                stream.enqueue(item)
