"""The shell of an engine whose segments are requests to a pool of HTTP
replicas (``upstream``, ``orpheus``): what such an engine does that does not
depend on what it asks of a replica.

What this module is for: ``PoolEngine`` holds the replica client, its
prober, the live jobs and the segments' tasks, and gives the lifecycle
(probes at start, ``aclose``), ``ready`` (``/readyz``: a replica is
routable), ``model_names``, the pool's metrics and ``live_jobs``.
``PoolStream`` starts each submitted segment at once, as a task of its own
(so a segment the speaker submits ahead is prefetched, within the
session's budget), and ``run_segment`` ends the job as the segment's
outcome says: a ``SynthesisError`` fails the segment with its message (and
its ``refused`` flag), a cancel cancels the job, a bug fails the segment
alone with its type only, logged with its traceback.  Cancel
(``SynthesisJob.cancel``, ``EngineStream.cancel``, barge-in) cancels the
segment's task: the read in progress ends and the response is closed.

An engine subclasses both, sets ``client`` (a ``replicas.ReplicaClient``
over its section, a ``PoolSettings``) and says what one segment is
(``PoolStream.segment``).  Neither alignment nor timings are invented: the
remote engines declare none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gateway.engines.base import Engine, StreamRequest, SynthesisError, VoiceInfo
from gateway.engines.delivery import DeliveredJob, DeliveryStream, LiveJobs
from gateway.engines.pool.probe import Prober
from gateway.engines.pool.replicas import ReplicaClient
from gateway.engines.pool.routing import ReplicaState
from gateway.engines.workcut import cut_text

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from gateway.settings import Settings

log = logging.getLogger(__name__)
# httpx logs every request's full URL at INFO, credentials included: never
logging.getLogger("httpx").setLevel(logging.WARNING)

_T = TypeVar("_T")


_C = TypeVar("_C", bound=ReplicaClient)


class PoolEngine(Engine, Generic[_C]):
    """An engine over a pool of replicas: the client (over the engine's
    section, ``client.settings``), probes, tasks and jobs."""

    def __init__(self, settings: Settings, client: _C) -> None:
        super().__init__(settings)
        self.client = client
        self.prober = Prober(client)
        self.live = LiveJobs()
        self.tasks: set[asyncio.Task[None]] = set()
        self._largest_item = 0  #: the longest request's engine text so far

    def work_items(self, text: str, limit: int) -> list[str]:
        """A segment's engine text as the requests it is spoken in (bounded
        work per item): pieces of at most ``limit`` characters, cut at
        clause, then word boundaries (``workcut.cut_text``), in order; the
        text itself when it is within ``limit`` (or has nothing to speak)."""
        return cut_text(text, limit, len) or [text]

    def record_work_item(self, size: int) -> None:
        """One request's size, in ``Capabilities.work_item_unit``."""
        self._largest_item = max(self._largest_item, size)

    def largest_work_item(self) -> int:
        return self._largest_item

    # --- lifecycle -------------------------------------------------------------------

    async def start_probes(self) -> None:
        """One round of probes, then the probe loop (when probes are on)."""
        if self.prober.enabled:
            await self.prober.probe_all()
            self.prober.start()

    def replicas_ready(self) -> str:
        """``2 of 3 replicas ready, <their redacted URLs>``, for the start-up
        log line."""
        now = self.client.clock()
        pool = self.client.pool
        ready = sum(1 for r in pool.replicas if pool.state_of(r.index, now) is ReplicaState.READY)
        names = ", ".join(r.name for r in pool.replicas)
        return f"{ready} of {len(pool.replicas)} replicas ready, {names}"

    async def close_helpers(self) -> None:
        """Stop what the engine runs beside the probes (after them, before
        the segments are cancelled); nothing by default."""

    async def aclose(self) -> None:
        await self.prober.aclose()
        await self.close_helpers()
        self.live.cancel_all()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.client.aclose()

    def ready(self) -> bool:
        """At least one replica is routable (``/readyz``)."""
        return self.client.pool.ready(self.client.clock())

    def model_names(self) -> Sequence[str]:
        model = self.client.settings.model
        return (model,) if model else ()

    def collectors(self) -> Sequence[Collector]:
        from gateway.engines.pool.metrics import PoolCollector

        return (PoolCollector(self.client),)

    def live_jobs(self) -> int:
        return len(self.live)

    # --- segments ----------------------------------------------------------------------

    def spawn(self, job: DeliveredJob, work: Coroutine[Any, Any, None]) -> None:
        """Run one segment's ``work`` as a task the job's cancel cancels."""
        loop = asyncio.get_running_loop()
        task = loop.create_task(work, name=f"{self.name}-segment")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

        def stop() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the task is gone
                loop.call_soon_threadsafe(task.cancel)

        job.on_cancel(stop)

    async def run_segment(
        self,
        job: DeliveredJob,
        label: str,
        work: Awaitable[_T],
        abort: Callable[[], None] = lambda: None,
    ) -> tuple[_T] | None:
        """Await a segment's request: its result (in a 1-tuple), or None when
        the job was ended here (``abort`` is called first: the engine drops
        what it holds for the segment)."""
        try:
            return (await work,)
        except SynthesisError as exc:
            abort()
            if not job.cancelled:
                log.warning("%s segment failed (%s): %s", self.name, label, exc)
            job.finish(exc)
        except asyncio.CancelledError:
            abort()
            job.cancel()
            raise
        except Exception as exc:  # a bug: this segment fails alone
            abort()
            log.exception("%s segment failed (%s)", self.name, label)
            job.fail(f"synthesis failed: {type(exc).__name__}")
        return None


_E = TypeVar("_E", bound=PoolEngine[Any])


class PoolStream(DeliveryStream, Generic[_E]):
    """One utterance: each segment's request, a task of its own."""

    #: what a missing voice's message starts with (``the upstream has no voice``)
    no_voice = "the engine has no voice"

    def __init__(self, request: StreamRequest, engine: _E) -> None:
        super().__init__(request, engine.live)
        self.engine = engine

    def start(self, job: DeliveredJob) -> None:
        if not job.started():
            return
        job.skip_timings()  # no alignment: none are invented
        voice = self.engine.find_voice(self.request.voice)
        if voice is None:
            raise SynthesisError(f"{self.no_voice} {self.request.voice!r}")
        self.engine.spawn(job, self.segment(job, voice))

    def segment(self, job: DeliveredJob, voice: VoiceInfo) -> Coroutine[Any, Any, None]:
        """The work of one segment (a coroutine, run as a task); raising
        ``SynthesisError`` here fails the segment before it starts."""
        raise NotImplementedError
