"""One segment spoken, the same on WebSocket and HTTP: its engine job in,
its audio out at the output rate with its pauses, failures classified once.

Both surfaces speak text the same way::

    segments (gateway.delivery.queue) -> segment_job -> SegmentAudio -> the sink

The queue orders the segments and submits the next one early
(``segment_job``: the engine's job, or a ``SilentJob`` when the segment has
nothing to speak); ``SegmentAudio`` gives the segment's SSML pause before
its speech (``pause_before``), reads its job and yields its events with the
audio already at the output rate (through the caller's ``StreamResampler``,
which carries its state from one segment to the next), then its pause
after (``pause_after``, once the job completed); the sink frames or encodes
what it gets: the WebSocket's ``AudioStream`` (tagged or raw frames, flow
control, the session buffer) and the HTTP API's ``synthesize`` plus
``ContainerEncoder`` (``gateway.http.synthesis``).

Failure handling is written here and nowhere else: an engine's
``SynthesisError`` is logged as a warning and becomes ``engine_refused``
when the engine refused the text, else ``internal`` with the engine's
message; any other exception is a bug in the gateway, logged with its
traceback, and reaches the client as ``internal`` with no exception text.
Either way the job is cancelled and ``failure`` holds the error for the
sink to report; nothing is raised.  A sink that stops reading early (a
cancel, a disconnect, a failed send) closes the generator, which cancels
the job and closes the engine's iterator at once, not at garbage
collection.

What it must not do: send, encode or frame (the sinks do), or decide what
a failure means for the session (the session core does).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gateway.audio.resample import StreamResampler
from gateway.delivery.silence import SilentJob, pause_ms, pause_samples
from gateway.engines.base import (
    AudioChunk,
    SegmentRequest,
    SynthesisError,
    SynthesisJob,
    WordTimings,
)
from gateway.errors import ErrorCode, GatewayError
from gateway.text.frontend import SpokenSegment

log = logging.getLogger(__name__)

#: what a client is told of a bug in the gateway (the log has the traceback)
INTERNAL_MESSAGE = "the gateway failed while synthesizing this text (logged on the server)"


@dataclass(frozen=True)
class Audio:
    """A chunk of a segment's audio, at the output rate."""

    samples: npt.NDArray[np.float32]
    #: the engine chunk's length in samples at the voice's rate (the session
    #: buffer releases what the engine reserved, in those units)
    native_samples: int


def segment_job(
    text: str, deadline: float, submit: Callable[[SegmentRequest], SynthesisJob]
) -> SynthesisJob:
    """The job that speaks a segment whose engine text is ``text``: the
    engine's (``submit``, called only then), or a ``SilentJob`` when there is
    nothing to speak (its pauses are made by ``SegmentAudio``)."""
    if not text.strip():
        return SilentJob()
    return submit(SegmentRequest(text=text, deadline=deadline))


def failure_error(exc: Exception) -> GatewayError:
    """A failed segment as both surfaces report it: ``engine_refused`` when
    the engine refused the text as invalid, ``busy`` when no engine server
    could take it now (HTTP 503 with ``Retry-After``), ``internal`` otherwise (with the
    engine's message for an engine failure, none for a gateway bug)."""
    if isinstance(exc, SynthesisError):
        if exc.refused:
            return GatewayError(ErrorCode.ENGINE_REFUSED, str(exc))
        if exc.busy:  # capacity: no engine server could take it now (retry advice follows)
            return GatewayError(ErrorCode.BUSY, str(exc) or "no engine server can take it now")
        # the engine's own words ("synthesis failed: ..."): written for clients
        return GatewayError(ErrorCode.INTERNAL, str(exc) or "synthesis failed")
    return GatewayError(ErrorCode.INTERNAL, INTERNAL_MESSAGE)


class SegmentAudio:
    """One segment as its sink speaks it: ``pause_before()``, then
    ``events()``, then ``pause_after()``.

    ``events()`` yields ``WordTimings`` and ``Audio`` in the engine's order,
    and ends early, without raising, when the job fails: ``failure`` then
    holds the error to report.  Use it under ``contextlib.aclosing``.
    ``spoken``: the segment's spoken form, whose SSML ``<break>`` pauses are
    silence made here (None: none)."""

    def __init__(
        self,
        job: SynthesisJob,
        resampler: StreamResampler,
        *,
        spoken: SpokenSegment | None = None,
        where: str = "",
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] = log,
    ) -> None:
        self.job = job
        self.resampler = resampler
        self._pauses = pause_ms(spoken)
        self.where = where  #: for the log line: which request, context, segment
        self.log = logger
        self.failure: GatewayError | None = None
        self.complete = False  #: the job's events ran to their end

    def pause_before(self) -> npt.NDArray[np.float32]:
        """The silence before the segment's speech, at the output rate
        (empty: none)."""
        return self._silence(self._pauses[0])

    def pause_after(self) -> npt.NDArray[np.float32]:
        """The silence after the segment's speech, at the output rate (empty:
        none); for a segment whose job completed and that was not cut."""
        return self._silence(self._pauses[1])

    def _silence(self, ms: int) -> npt.NDArray[np.float32]:
        piece = pause_samples(ms, self.resampler.in_rate)
        # through the resampler: its state carries across the segment's audio
        return self.resampler.process(piece) if piece.size else piece

    def broke(self) -> GatewayError:
        """The sink failed on this segment's audio (a bug: called in its
        ``except`` block): logged with the traceback, the job cancelled, and
        ``failure`` set to ``internal`` with no exception text."""
        self.log.exception("speaking a segment broke (%s)", self.where)
        self.job.cancel()
        self.failure = failure_error(RuntimeError())
        return self.failure

    async def events(self) -> AsyncGenerator[WordTimings | Audio, None]:
        events = self.job.__aiter__()
        try:
            async for event in events:
                if isinstance(event, AudioChunk):
                    out = self.resampler.process(event.samples)
                    yield Audio(out, event.samples.size)
                elif isinstance(event, WordTimings):
                    yield event
            self.complete = True
        except SynthesisError as exc:  # the engine failed this segment
            self.log.warning("synthesis failed (%s): %s", self.where, exc)
            self.failure = failure_error(exc)
        except Exception as exc:  # a bug in the gateway: logged whole, never shown
            self.log.exception("speaking a segment broke (%s)", self.where)
            self.failure = failure_error(exc)
        finally:
            if not self.complete:  # failed, or the sink stopped reading
                self.job.cancel()
            # close the engine's iterator now (not at garbage collection) so
            # its own cleanup runs when the sink leaves early
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
