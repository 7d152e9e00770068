"""Active health checks of the replicas: the thin async layer over
``pool.Pool.probed``.

Every ``probe_interval_s`` each replica gets, concurrently and with
``probe_timeout_s`` each: ``GET health_path`` (liveness; skipped when the
path is empty), then the ``ready_paths`` in order until one answers 2xx
(readiness: vllm-omni answers ``/v1/models``; this gateway and vllm-omni
``/v1/audio/voices``).  A replica passing both is ready.  When the readiness
answer is a voice listing its voices are recorded, so the engine lists the
voices merged across replicas and routes a voice only some replicas hold to
those.  With no health path and no readiness paths, probing is off and the
pool relies on passive ejection alone (OpenAI has no ``/health``).

Probe failures are logged once per change of state, with the redacted URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import httpx

from gateway.engines.upstream.pool import ReplicaState
from gateway.engines.upstream.replicas import ReplicaClient

log = logging.getLogger(__name__)

#: a readiness answer larger than this is not parsed for voices
_MAX_LISTING_BYTES = 256 * 1024


def listed_voices(doc: Any) -> list[dict[str, Any]]:
    """Voices in a ``GET /v1/audio/voices`` answer: this gateway's ``data``
    entries of type ``builtin`` (with rate and language), else the names of
    the ``voices`` array (vllm-omni, with its ``uploaded_voices``)."""
    if not isinstance(doc, dict):
        return []
    data = doc.get("data")
    if isinstance(data, list):
        rich = [
            v
            for v in data
            if isinstance(v, dict) and v.get("type") == "builtin" and isinstance(v.get("name"), str)
        ]
        if rich:
            return rich
    names = doc.get("voices")
    out = [{"name": n} for n in names if isinstance(n, str)] if isinstance(names, list) else []
    uploaded = doc.get("uploaded_voices")
    if isinstance(uploaded, list):
        seen = {v["name"].casefold() for v in out}
        for entry in uploaded:
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str) and name.casefold() not in seen:
                out.append({"name": name})
    return out


class Prober:
    def __init__(self, client: ReplicaClient) -> None:
        self.client = client
        self.settings = client.settings
        #: the voice listings each replica answered (None: not a listing)
        self.listings: list[list[dict[str, Any]] | None] = [None] * len(client.bases)
        self._task: asyncio.Task[None] | None = None
        self._last: list[ReplicaState | None] = [None] * len(client.bases)

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
                await self._record_voices(index, response)
                break
        client = self.client
        client.pool.probed(index, healthy, client.clock())
        state = client.pool.replicas[index].state
        if state != self._last[index]:
            self._last[index] = state
            log.info("upstream replica %s is %s", client.pool.replicas[index].name, state)

    async def _record_voices(self, index: int, response: httpx.Response) -> None:
        if len(response.content) > _MAX_LISTING_BYTES:
            return
        doc: Any = None
        with contextlib.suppress(ValueError):
            doc = await asyncio.to_thread(json.loads, response.content)
        voices = listed_voices(doc)
        if not voices:
            return
        self.listings[index] = voices
        self.client.replica_voices[index] = frozenset(v["name"].casefold() for v in voices)
