"""The text front-end's reading of committed segments, on or off the event loop.

Reading a segment costs up to about 0.5 ms of CPU at p99 (0.7 ms measured
under load) and 7-9 ms for adversarial text of 500 characters
(docs/text.md); its passes are linear in the text.  A short segment (at
most ``INLINE_READ_CHARS``, when no earlier read is pending) is read at once
on the loop: a worker-thread hop costs more than the reading and delays the
first audio (measured: +9 ms p50, +24 ms p95 of flush time to first audio).
A longer one runs in a worker thread, one call at a time per utterance (its
``FrontEnd`` carries state), chained in commit order; the stream submits a
segment to the engine only once it is read (``QueuedSegment.read``).

The session core calls these as it commits text; the reading itself is
``Utterance.read`` (pure, on the utterance's ``FrontEnd``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gateway.engines.base import Capabilities
from gateway.protocol import EffectiveConfig
from gateway.session.audio_stream import QueuedSegment
from gateway.session.utterance import Segment, Utterance
from gateway.text.frontend import FrontEnd
from gateway.text.stage import Lexicon, frontend_options

log = logging.getLogger(__name__)

#: segments up to this length are read by the front-end on the event loop
#: (worst case about 3 ms of CPU for adversarial text; typical 0.1 ms)
INLINE_READ_CHARS = 200


def new_frontend(config: EffectiveConfig, capabilities: Capabilities, lexicon: Lexicon) -> FrontEnd:
    """The text front-end of an utterance starting now (``docs/text.md``)."""
    return FrontEnd(
        frontend_options(
            input_format=config.input_format,
            normalize=config.normalize,
            emoji=config.emoji,
            pronunciations=config.pronunciations,
            language=config.language,
            capabilities=capabilities,
            lexicon=lexicon,
        )
    )


def read(item: QueuedSegment, read_done: Callable[[], None]) -> None:
    """The front-end reads ``item``'s segment: at once, or in a worker thread
    after the utterance's earlier readings (``read_done`` is called when
    that one ends: the stream may submit the segment)."""
    utt = item.utterance
    if utt.frontend is None:
        return
    idle = utt.reading is None or utt.reading.done()
    if idle and len(item.segment.text) <= INLINE_READ_CHARS:
        try:
            utt.read(item.segment)
        except Exception:  # a front-end bug must not stop the session
            log.exception("the text front-end failed; the segment is read as written")
        return
    item.read = utt.reading = asyncio.ensure_future(
        _read_after(utt.reading, utt.read, item.segment)
    )
    item.read.add_done_callback(lambda _: read_done())


def finish_reading(utt: Utterance) -> None:
    """The utterance's text is complete (``input.done``): the front-end's
    end-of-text check runs after its last read (at once if none is left)."""
    pending = utt.reading
    if pending is None or pending.done():
        utt.finish_reading()  # a check of carried state: no parsing
        return
    utt.reading = asyncio.ensure_future(_finish_after(pending, utt))


async def _read_after(
    before: asyncio.Future[None] | None, call: Callable[[Segment], None], segment: Segment
) -> None:
    if before is not None:
        await asyncio.wait({before})
    try:
        await asyncio.to_thread(call, segment)
    except Exception:  # a front-end bug must not stop the session
        log.exception("the text front-end failed; the segment is read as written")


async def _finish_after(before: asyncio.Future[None], utterance: Utterance) -> None:
    await asyncio.wait({before})
    utterance.finish_reading()
