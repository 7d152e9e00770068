"""A session's admission: the server's door, then the session's own share.

A session is admitted once, at its first committed text (``ticket``: a
ticket of the server's gate, ``gateway.flow.admission``, whose
``max_active_streams`` counts admitted sessions); it keeps its admission
until it ends, so none of its utterances, contexts or re-asks is ever
refused or cut for capacity.  A session that finds the door closed waits in
the gate's bounded queue (its committed segments wait here, in ``waiting``;
more text is accepted meanwhile and held unread, ``Committer.push``); past
the deadline it is answered ``busy`` before any of its audio.  Inside an
admitted session, ``max_streams_per_session`` utterances (all its
contexts together) stream at once; more wait here for one of the
session's own to end: the share delays, never refuses.  An utterance
streams (``holds_slot``) while committed text of it is being synthesized,
queued or sent; text still in the segmenter holds nothing.

The gate's decision arrives as an event (``Session.slot_event``, delivered
by the endpoint): ``granted`` hands the waiting segments to their streams
(``enqueue``); ``refused`` gives the session the waiting utterances to
answer ``busy`` and report as not spoken.  No I/O, no messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway.errors import ErrorCode, GatewayError
from gateway.flow.admission import AdmissionGate, Ticket
from gateway.session.audio_stream import QueuedSegment
from gateway.session.contexts import Context
from gateway.session.utterance import Utterance


class SessionDoor:
    def __init__(
        self,
        admission: AdmissionGate,
        client: str,
        share: int,
        enqueue: Callable[[Context, QueuedSegment], None],
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.admission = admission
        #: whom admission's fairness counts this session as (address or agent key)
        self.client = client
        #: the most utterances of this session streaming at once (``max_streams_per_session``)
        self.share = share
        #: hands a segment to its context's stream (``Session``)
        self._enqueue = enqueue
        self.log = log
        #: the session's admission (``take``): waiting at the door or granted
        self.ticket: Ticket | None = None
        #: utterances streaming (committed text being synthesized, queued or sent)
        self.holding: set[Utterance] = set()
        #: utterances committed and waiting (for the door, or for the session's
        #: share): their context and segments, in commit order
        self.waiting: dict[Utterance, tuple[Context, list[QueuedSegment]]] = {}

    @property
    def admitted(self) -> bool:
        return self.ticket is not None and self.ticket.state == "granted"

    def speaking(self) -> bool:
        """Some utterance is streaming or waiting to."""
        return bool(self.holding or self.waiting)

    def at_door(self, utt: Utterance | None) -> bool:
        """``utt`` has committed text waiting for the door (not for the share)."""
        return (
            self.ticket is not None
            and self.ticket.state == "waiting"
            and utt is not None
            and utt in self.waiting
        )

    def waits_for(self, ctx: Context) -> bool:
        """Committed segments of ``ctx`` wait for the door or the share."""
        return any(c is ctx for c, _ in self.waiting.values())

    def refusal(self) -> str | None:
        """Why a commit could not be admitted or wait at the door now (None: it can)."""
        if self.ticket is not None:
            return None
        return self.admission.refusal()

    def check(self, what: str) -> None:
        """Refuse (``busy``) text of a session that is not admitted when the
        door is closed and its queue full (or the server drains): that text
        could not be committed."""
        refusal = self.refusal()
        if refusal is not None:
            raise self.busy(refusal, what)

    def busy(self, refusal: str, what: str, waited_s: float | None = None) -> GatewayError:
        """The ``busy`` error of a ``refusal``; ``waited_s``: the time a
        refused session waited at the door first."""
        retry = self.admission.queue.retry_after_s
        if refusal == "draining":
            return GatewayError(
                ErrorCode.BUSY,
                f"the server is draining (shutting down); {what}, reconnect to another server",
                retry_after_s=retry,
                waited_s=waited_s,
            )
        if refusal == "deadline":
            return GatewayError(
                ErrorCode.BUSY,
                f"the server is full: no conversation ended within"
                f" {self.admission.queue.deadline_s:g} s (all {self.admission.limit} admitted"
                f" sessions are speaking); {what}, retry after retry_after_ms or connect to"
                " another server",
                retry_after_s=retry,
                waited_s=waited_s,
            )
        return GatewayError(
            ErrorCode.BUSY,
            f"the server is full ({self.admission.limit} sessions admitted) and its admission"
            f" queue is full; {what}, retry after retry_after_ms or connect to another server",
            retry_after_s=retry,
        )

    def take(
        self, ctx: Context, utt: Utterance, holder: object, notify: Callable[[Ticket], None]
    ) -> None:
        """``utt`` commits text: it streams, or waits for the door or the share."""
        if utt.holds_slot or utt in self.waiting:
            return
        if self.ticket is None:
            ticket = self.admission.ask(self.client, holder, notify=notify)
            if ticket.state == "refused":
                # callers checked ``refusal`` first in the same call, so
                # this cannot happen; if it ever did, the work goes on
                # uncounted rather than losing text
                self.log.warning("committed text without admission")
                self._hold(utt)
                return
            self.ticket = ticket
        if self.admitted and len(self.holding) < self.share:
            self._hold(utt)
        else:
            self.waiting[utt] = (ctx, [])

    def _hold(self, utt: Utterance) -> None:
        utt.holds_slot = True
        self.holding.add(utt)

    def granted(self, ticket: Ticket) -> None:
        """The door let the session in: the waiting utterances stream, as the
        share allows."""
        for utt in self.waiting:
            utt.admission_wait_ms = ticket.waited_s * 1000
        self.promote()

    def refused(self, ticket: Ticket) -> tuple[GatewayError, dict[Context, list[Utterance]]]:
        """The door refused the session (deadline, draining): the ``busy``
        error and every waiting utterance, by context, no longer waiting."""
        self.ticket = None
        assert ticket.refusal is not None
        error = self.busy(ticket.refusal, "this utterance was not spoken", ticket.waited_s)
        refused: dict[Context, list[Utterance]] = {}
        for utt, (ctx, _) in list(self.waiting.items()):
            refused.setdefault(ctx, []).append(utt)
        self.waiting.clear()
        return error, refused

    def promote(self) -> None:
        """Admitted: waiting utterances stream, in commit order, as the share allows."""
        if not self.admitted:
            return
        for utt in list(self.waiting):
            if len(self.holding) >= self.share:
                return
            ctx, segments = self.waiting.pop(utt)
            self._hold(utt)
            for segment in segments:
                self._enqueue(ctx, segment)

    def release(self, utt: Utterance) -> None:
        """``utt`` streams no more (its committed text is spoken, or it was
        cancelled): the session's share frees; its admission stays."""
        utt.holds_slot = False
        self.holding.discard(utt)
        self.waiting.pop(utt, None)
        if self.ticket is not None and self.ticket.state == "waiting" and not self.waiting:
            # nothing waits at the door any more (cancelled): leave the queue
            self.admission.release(self.ticket)
            self.ticket = None
        self.promote()

    def leave(self) -> None:
        """The session ends: its admission goes back to the gate."""
        if self.ticket is not None:
            self.admission.release(self.ticket)
            self.ticket = None
