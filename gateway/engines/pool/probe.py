"""Active health checks of the replicas: the thin async layer over
``pool.Pool.probed``.

Every ``probe_interval_s`` each replica gets, concurrently and with
``probe_timeout_s`` each: ``GET health_path`` (liveness; skipped when the
path is empty), then the ``ready_paths`` in order until one answers 2xx
(readiness: vllm-omni answers ``/v1/models``; this gateway and vllm-omni
``/v1/audio/voices``).  A replica passing both is ready.

The voices are read on their own schedule: ``GET voices_path`` of a ready
replica whose listing was never read, or last read ``voices_interval_s``
ago (a readiness answer from ``voices_path`` itself counts as a read).  The
last good listing is kept: a failed read, an answer that is not a listing,
or a failed readiness probe changes the replica's readiness, never its
voices, so a voice that worked a minute ago does not become unknown because
one probe fell through to another path.  The engine lists the voices merged
across replicas and routes a voice only some replicas hold to those.
Uploaded voices a replica lists (``uploaded_voices``) count as held by it
even when it cannot speak them, so routing and the reconciling of uploads
(``voices.VoiceCopies``) see them.  With no health path and no readiness
paths, probing is off and the pool relies on passive ejection alone (OpenAI
has no ``/health``).

Probe failures are logged once per change of state, with the redacted URL.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import httpx

from gateway.engines.pool.replicas import ReplicaClient
from gateway.engines.pool.routing import ReplicaState

log = logging.getLogger(__name__)

#: a readiness answer larger than this is not parsed for voices
MAX_LISTING_BYTES = 256 * 1024


def listed_voices(doc: Any) -> list[dict[str, Any]]:
    """Speakable voices in a ``GET /v1/audio/voices`` answer: this gateway's
    ``data`` entries of type ``builtin`` (with rate and language), else the
    names of the ``voices`` array (vllm-omni); then the uploaded voices
    (``uploaded_voices``, vllm-omni's and this gateway's) unless the replica
    says it cannot speak them (``speakable: false``)."""
    if not isinstance(doc, dict):
        return []
    out: list[dict[str, Any]] = []
    data = doc.get("data")
    if isinstance(data, list):
        out = [
            v
            for v in data
            if isinstance(v, dict) and v.get("type") == "builtin" and isinstance(v.get("name"), str)
        ]
    if not out:
        names = doc.get("voices")
        out = [{"name": n} for n in names if isinstance(n, str)] if isinstance(names, list) else []
    seen = {v["name"].casefold() for v in out}
    for name, speakable in _uploaded(doc):
        if speakable and name.casefold() not in seen:
            seen.add(name.casefold())
            out.append({"name": name})
    return out


def held_voices(doc: Any) -> frozenset[str]:
    """Every voice name a listing shows (case-folded), speakable or not:
    what the replica *holds*, for routing and for reconciling uploads."""
    if not isinstance(doc, dict):
        return frozenset()
    held = {v["name"].casefold() for v in listed_voices(doc)}
    held.update(name.casefold() for name, _ in _uploaded(doc))
    return frozenset(held)


def _uploaded(doc: dict[str, Any]) -> list[tuple[str, bool]]:
    """(name, speakable) of a listing's ``uploaded_voices``."""
    uploaded = doc.get("uploaded_voices")
    if not isinstance(uploaded, list):
        return []
    out = []
    for entry in uploaded:
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str):
            out.append((name, entry.get("speakable") is not False))
    return out


def parse_listing(content: bytes) -> Any:
    """The JSON of a listing (blocking: call it off the event loop); None
    when it is too large or not JSON."""
    if len(content) > MAX_LISTING_BYTES:
        return None
    try:
        return json.loads(content)
    except ValueError:
        return None


class Prober:
    def __init__(self, client: ReplicaClient) -> None:
        self.client = client
        self.settings = client.settings
        #: the voice listings each replica answered (None: not a listing)
        self.listings: list[list[dict[str, Any]] | None] = [None] * len(client.bases)
        self._task: asyncio.Task[None] | None = None
        self._last: list[ReplicaState | None] = [None] * len(client.bases)
        #: when each replica's listing was last read well (None: never)
        self._listed_at: list[float | None] = [None] * len(client.bases)
        #: called with a replica's index after each of its probes (the voice
        #: copies reconcile a replica that returned)
        self.listeners: list[Callable[[int], None]] = []

    @property
    def enabled(self) -> bool:
        return bool(self.settings.health_path or self.settings.ready_paths)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._probe(i) for i in range(len(self.client.bases))))

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="upstream-probes")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.probe_interval_s)
            try:
                await self.probe_all()
            except Exception:  # a bug here must not stop the probes for good
                log.exception("upstream probe round failed")

    async def _get(self, index: int, path: str) -> httpx.Response | None:
        url = self.client.bases[index] + path
        try:
            async with asyncio.timeout(self.settings.probe_timeout_s):
                response = await self.client.http.get(url)
        except (TimeoutError, httpx.HTTPError):
            return None
        return response

    async def _probe(self, index: int) -> None:
        epoch = self.client.voice_epoch[index]
        healthy = True
        if self.settings.health_path:
            response = await self._get(index, self.settings.health_path)
            healthy = response is not None and response.is_success
        if healthy and self.settings.ready_paths:
            healthy = False
            for path in self.settings.ready_paths:
                response = await self._get(index, path)
                if response is None or not response.is_success:
                    continue
                healthy = True
                if path == self.settings.voices_path:
                    await self._record_voices(index, response, epoch)
                break
        if healthy and self._listing_due(index):
            response = await self._get(index, self.settings.voices_path)
            if response is not None and response.is_success:
                await self._record_voices(index, response, epoch)
        client = self.client
        client.pool.probed(index, healthy, client.clock())
        state = client.pool.replicas[index].state
        if state != self._last[index]:
            self._last[index] = state
            log.info("upstream replica %s is %s", client.pool.replicas[index].name, state)
        for listener in self.listeners:
            listener(index)

    def _listing_due(self, index: int) -> bool:
        if not self.settings.voices_path:
            return False
        last = self._listed_at[index]
        return last is None or self.client.clock() - last >= self.settings.voices_interval_s

    async def _record_voices(self, index: int, response: httpx.Response, epoch: int) -> None:
        doc = await asyncio.to_thread(parse_listing, response.content)
        held = held_voices(doc)
        if not held or self.client.voice_epoch[index] != epoch:
            return  # not a listing (the last good one stays), or an upload overtook it
        self._listed_at[index] = self.client.clock()
        self.listings[index] = listed_voices(doc)
        self.client.replica_voices[index] = held
