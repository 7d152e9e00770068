"""Contexts of one session: the state each ``context_id`` carries.

A context is an independent stream of utterances inside one session
(``context_id``; ``null`` is the default context).  Each has its own
segmentation policy, its listener model and the positions its tagged frames carry.
``Contexts`` is the registry: it creates contexts on first use, enforces
``max_contexts`` live ones and forgets idle ones when many ids were seen.

Pure state: no I/O, no tasks.  Whether a context still has audio in flight
is the session's question to answer (``is_live``), since the audio streams
are the session's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gateway.errors import ErrorCode, GatewayError
from gateway.flow.listener import Listener
from gateway.session.ledger import ContextAudio
from gateway.session.utterance import Utterance
from gateway.text.policy import SegmentPolicy

#: ``cancel.context_id`` that names every context
ALL_CONTEXTS = "*"


@dataclass(eq=False)
class Context:
    id: str | None
    number: int  #: the 16-bit number tagged frames carry
    #: the segmenter and the listener-driven policy of ``auto``
    policy: SegmentPolicy
    #: the utterance accepting text (until its ``input.done``)
    utterance: Utterance | None = None
    #: utterances whose ``input.done`` arrived and whose audio is still going out
    pending: list[Utterance] = field(default_factory=list)
    #: cancelled utterances whose report waits for the stream's last frame
    awaiting_report: list[Utterance] = field(default_factory=list)
    #: its audio messages (sequence numbers): the ledger's, written by the stream only
    audio: ContextAudio = field(default_factory=ContextAudio)
    #: the policy's next check while no text arrives (docs/segmentation.md)
    segment_timer: asyncio.TimerHandle | None = None
    #: the listener: admission, cancel positions, audio ahead for segmentation
    listener: Listener = field(default_factory=Listener)
    underrun: bool = False  #: in an underrun episode (metrics count episodes)

    def open_utterances(self) -> list[Utterance]:
        """Utterances not yet reported: ended ones still sending, then the open one."""
        return [*self.pending, *([self.utterance] if self.utterance is not None else [])]

    def cancel_segment_timer(self) -> None:
        if self.segment_timer is not None:
            self.segment_timer.cancel()
            self.segment_timer = None


class Contexts:
    """The contexts of one session, by ``context_id``."""

    def __init__(self, max_live: int, is_live: Callable[[Context], bool]) -> None:
        self.max_live = max_live
        self._is_live = is_live
        self._by_id: dict[str | None, Context] = {}
        self._numbers = 0

    def __iter__(self) -> Iterator[Context]:
        return iter(list(self._by_id.values()))

    def get(self, cid: str | None) -> Context | None:
        return self._by_id.get(cid)

    def targets(self, cid: str | None) -> list[Context]:
        """The contexts a ``cancel`` names (``"*"``: all of them)."""
        if cid == ALL_CONTEXTS:
            return list(self._by_id.values())
        ctx = self._by_id.get(cid)
        return [] if ctx is None else [ctx]

    def live_count(self) -> int:
        return sum(1 for c in self._by_id.values() if self._is_live(c))

    def get_or_create(
        self, cid: str | None, new_policy: Callable[[], SegmentPolicy]
    ) -> tuple[Context, list[Context]]:
        """The context ``cid``, created if new; also the idle contexts
        forgotten to make room (their resources are the caller's to free).
        Raises ``invalid_state`` past ``max_live`` live contexts."""
        ctx = self._by_id.get(cid)
        if ctx is not None:
            return ctx, []
        if self.live_count() >= self.max_live:
            raise GatewayError(
                ErrorCode.INVALID_STATE,
                f"too many live contexts (limit {self.max_live}); finish or cancel one first",
            )
        # an idle context keeps its positions while its id may be reused;
        # forget the idle ones only when many ids have been seen
        forgotten: list[Context] = []
        if len(self._by_id) >= 4 * self.max_live:
            forgotten = [c for c in self._by_id.values() if not self._is_live(c)]
            for old in forgotten:
                del self._by_id[old.id]
        self._numbers = (self._numbers + 1) % 65536
        ctx = Context(id=cid, number=self._numbers, policy=new_policy())
        self._by_id[cid] = ctx
        return ctx, forgotten
