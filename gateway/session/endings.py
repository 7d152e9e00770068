"""How a session's utterances end: spoken (``session.done``), cancelled
(the cancel report), ended by ``session.close`` (the text never flushed
reported unspoken), cut by a silent ``ack`` listener, or lost with the
connection.

``Endings`` is what the audio streams report to (``StreamHost``: the
session-wide events, never one per frame): a segment left its stream's
queue, cancelled audio stopped, a listener went silent, the connection is
gone.  It answers with the messages to send, read from the text records and
the audio ledger (``gateway.session.ledger``), and frees the session's
share of the utterances that ended (``gateway.session.door``).  The session
core calls it for ``cancel``, the drain and ``session.close``.  No I/O.

A cancel is reported at once when none of the context's audio is in
flight; otherwise the stream sends the report right after its last frame
(``cancelled_audio_ended``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway import protocol
from gateway.errors import ErrorCode, GatewayError
from gateway.session.actions import Action, messages_only
from gateway.session.audio_stream import AudioStream
from gateway.session.cancel_report import cancel_report, heard_position
from gateway.session.contexts import Context, Contexts
from gateway.session.door import SessionDoor
from gateway.session.utterance import Segment, Utterance
from gateway.text.frontend import FrontEndError

if TYPE_CHECKING:
    from gateway.ops.metrics import Metrics


def _unclosed_error(context_id: str | None, problem: FrontEndError) -> protocol.Error:
    return protocol.Error(
        code=ErrorCode.INVALID_SSML,
        message=f"{problem.message} (at character {problem.position} of the utterance's text)",
        context_id=context_id,
    )


class Endings:
    def __init__(
        self,
        contexts: Contexts,
        door: SessionDoor,
        stream_for: Callable[[Context], AudioStream],
        cancel_jobs: Callable[[], None],
        report_error: Callable[[GatewayError, str | None], list[Action]],
        metrics: Metrics,
        ack_timeout_s: float,
    ) -> None:
        self.contexts = contexts
        self.door = door
        #: the stream speaking a context's audio (``Session._stream_for``)
        self._stream_for = stream_for
        #: stop every stream's engine work (``SessionStreams.cancel_jobs``)
        self._cancel_jobs = cancel_jobs
        #: the ``error`` event of an error (``Session.report_error``)
        self._report_error = report_error
        self.metrics = metrics
        self.ack_timeout_s = ack_timeout_s

    def _has_work_for(self, utt: Utterance, ctx: Context) -> bool:
        return utt in self.door.waiting or self._stream_for(ctx).has_work_for_utterance(utt)

    # --- what the audio streams report (``audio_stream.StreamHost``) ---------------
    def segment_dequeued(self, ctx: Context) -> list[protocol.ServerMessage]:
        """``session.done`` for each finished utterance of ``ctx``, in order."""
        messages: list[protocol.ServerMessage] = []
        while ctx.pending:
            utt = ctx.pending[0]
            if self._has_work_for(utt, ctx):
                break
            ctx.pending.pop(0)
            if utt.unsent_text:  # ended by session.close with text never flushed
                messages += self._report_unflushed(ctx, utt)
                continue
            self.door.release(utt)
            if utt.unclosed is not None:  # SSML left open at the end
                messages.append(_unclosed_error(ctx.id, utt.unclosed))
            messages.append(utt.session_done(ctx.id))
        # the open utterance's committed text is all spoken: it waits for
        # more text and holds no slot meanwhile
        current = ctx.utterance
        if current is not None and not self._has_work_for(current, ctx):
            self.door.release(current)
        return messages

    def listener_silent(self, ctx: Context) -> list[protocol.ServerMessage]:
        """Audio of ``ctx`` waited ``ack_timeout_s`` on a closed ``ack`` window
        with no ``playback``: tell the client, cancel and report its utterances
        (their slots are released with the report)."""
        error = GatewayError(
            ErrorCode.LISTENER_SILENT,
            f"no playback report for {self.ack_timeout_s:g} s while audio waited on"
            ' the flow_control "ack" window; the utterance was cancelled. Send playback'
            " (played_ms) as audio plays, or use flow_control realtime",
        )
        return messages_only([*self._report_error(error, ctx.id), *self.cancel(ctx.id)])

    def cancelled_audio_ended(
        self, ctx: Context, open_segment: Segment | None, *, delivered: bool
    ) -> list[protocol.ServerMessage]:
        """The reports that waited for the last frame of cancelled audio."""
        reports, ctx.awaiting_report = ctx.awaiting_report, []
        if not reports:
            return []
        if not delivered:  # nobody to tell; the slots are released here
            for utt in reports:
                self.door.release(utt)
            return []
        return self._report_cancel(ctx, reports, open_segment)

    def connection_lost(self) -> None:
        """The socket is gone: stop all engine work now."""
        for ctx in self.contexts:
            for utt in ctx.open_utterances():
                utt.cancelled = True
            ctx.listener.interrupt()
        self._cancel_jobs()

    def unheard(self) -> list[tuple[str | None, str]]:
        """Per context with any, the text of its open utterances the
        listener has not heard, text still in the segmenter included: what a
        cancel now would report as ``unspoken_text``, joined in order (the
        report of a suspended session that ends unresumed)."""
        now = time.monotonic()
        texts: list[tuple[str | None, str]] = []
        for ctx in self.contexts:
            position, _ = ctx.listener.position(now)
            parts: list[str] = []
            for utt in ctx.open_utterances():
                buffered = ctx.policy.buffered if utt is ctx.utterance else utt.unsent_text
                _, unspoken = utt.heard_split(heard_position(utt, position), buffered)
                if unspoken:
                    parts.append(unspoken)
            if parts:
                texts.append((ctx.id, " ".join(parts)))
        return texts

    # --- asked by the session core -------------------------------------------------
    def cancel(self, cid: str | None) -> list[Action]:
        """Stop a context's current and queued audio and discard its text
        (``"*"``: every context).

        The report is returned at once when none of the context's audio is
        in flight; otherwise the stream sends it right after its last frame."""
        messages: list[Action] = []
        for ctx in self.contexts.targets(cid):
            utterances = ctx.open_utterances()
            if utterances:
                messages += self.cancel_utterances(ctx, utterances)
        return messages

    def end_unflushed(self, ctx: Context) -> list[protocol.ServerMessage]:
        """End the context's open utterance for ``session.close``: its
        committed segments go on; the text never committed is set aside."""
        utt = ctx.utterance
        assert utt is not None
        ctx.cancel_segment_timer()
        utt.unsent_text = ctx.policy.discard().strip()
        utt.done_received = True  # no more text: the engine's input stream may end
        self._stream_for(ctx).close_if_complete(utt)
        ctx.utterance = None
        ctx.pending.append(utt)
        ctx.policy.end_utterance()
        return self.segment_dequeued(ctx)

    def _report_unflushed(self, ctx: Context, utt: Utterance) -> list[protocol.ServerMessage]:
        """An utterance ended by ``session.close`` has spoken all it committed:
        the cancel report, with everything sent counted as heard (nothing was
        interrupted) and the text never flushed as ``unspoken_text``."""
        self.metrics.cancels.inc()
        self.door.release(utt)
        return cancel_report(ctx.id, [utt], utt.flow_offset_ms + utt.audio.sent_ms, "sent_ms")

    def cancel_utterances(self, ctx: Context, utterances: list[Utterance]) -> list[Action]:
        """Stop these utterances of a context: their queued segments, their
        engine work and (for the open one) the text still buffered."""
        for utt in utterances:
            utt.cancelled = True
        if ctx.utterance is not None and ctx.utterance in utterances:
            ctx.utterance.unsent_text = ctx.policy.discard().strip()
            ctx.utterance = None
        ctx.pending = [u for u in ctx.pending if u not in utterances]
        ctx.listener.interrupt()
        ctx.cancel_segment_timer()
        if self._stream_for(ctx).cancel(utterances):
            # one of them is being spoken: the stream reports after its last frame
            ctx.awaiting_report.extend(utterances)
            return []
        return list(self._report_cancel(ctx, utterances, None))

    def _report_cancel(
        self,
        ctx: Context,
        utterances: list[Utterance],
        open_segment: Segment | None,
    ) -> list[protocol.ServerMessage]:
        position, source = ctx.listener.position(time.monotonic())
        for utt in utterances:
            self.metrics.cancels.inc()
            self.door.release(utt)
        sent_bytes = 0 if open_segment is None else open_segment.audio.sent_bytes
        return cancel_report(ctx.id, utterances, position, source, open_segment, sent_bytes)
