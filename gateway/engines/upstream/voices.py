"""Uploaded voices on every replica: fan-out of uploads and deletions, and
reconciling a replica that returns.

vllm-omni keeps uploaded voices per server (``POST /v1/audio/voices``,
multipart ``audio_sample``/``name``/``consent``; ``DELETE
/v1/audio/voices/{name}``).  The gateway's own store (``voice_store``) is
the truth: it holds every voice uploaded through the gateway, audio
included, within the store's limits (10 MiB and 30 s per voice).  This
module keeps the replicas' copies in line with it:

* **Upload**: a voice stored by the gateway is sent to every routable
  replica at once.  The upload succeeds when at least one replica holds it
  (a 2xx, or 409: a voice of that name is already there); the others get it
  when reconciled.  When none holds it, the gateway refuses the upload (a
  replica's 4xx message as ``invalid_config``; no replica reachable:
  ``busy``) and the store drops it again.
* **Deletion**: the gateway deletes its copy, then each routable replica's
  (a 4xx means there is nothing to delete).  A replica that was not
  reachable keeps a tombstone here (in memory, the newest ``MAX_TOMBSTONES``
  per replica) and is told when reconciled.
* **Reconcile**: a replica is reconciled when a probe finds it routable
  after it was not (down, unready or ejected), when its listing lacks a
  voice it should hold or shows one deleted here, and after a request to it
  failed for a reason that is not its answer.  Reconciling lists its voices
  (``GET /v1/audio/voices``), deletes the tombstoned ones it holds and
  uploads, one at a time (one voice's audio in memory per replica), those
  it lacks.  A replica that refused a voice with a 4xx is not asked again
  for it until it returns from being down.

Routing reads ``UpstreamClient.replica_voices``: this module adds a voice
there as soon as a replica holds it and removes it when deleted, so a voice
only some replicas hold goes to those (``client._without_voice``).

Only with ``upstream.cloning = true``: an upstream that cannot clone has no
use for reference audio, and the gateway keeps uploads to itself as with
Piper.  Without active probes there is no "return" to see: uploads fan out
to every replica, and reconciling happens at start only.

What it must not do: block the event loop (the store is read in a worker
thread), hold more than one voice's audio per replica, or log URLs with
credentials.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from gateway.engines.pool.probe import held_voices, parse_listing
from gateway.engines.pool.replicas import error_message
from gateway.engines.pool.routing import Outcome, ReplicaState, classify_status
from gateway.engines.upstream.client import UpstreamClient
from gateway.errors import ErrorCode, GatewayError

if TYPE_CHECKING:
    from gateway.voices.store import StoredVoice, VoiceStore

log = logging.getLogger(__name__)

#: deletions remembered per replica for one that was unreachable
MAX_TOMBSTONES = 1024


class Copy(enum.Enum):
    HELD = "held"  #: the replica holds the voice (or no longer holds a deleted one)
    REFUSED = "refused"  #: the replica answered 4xx: the request itself is refused
    FAILED = "failed"  #: unreachable, timeout, 5xx, full: try again when reconciled


@dataclass(frozen=True)
class Result:
    copy: Copy
    message: str = ""


def key_of(name: str) -> str:
    return name.casefold()  # as the replicas' listings are compared (client.replica_voices)


class VoiceCopies:
    def __init__(self, client: UpstreamClient) -> None:
        self.client = client
        self.store: VoiceStore | None = None
        n = len(client.bases)
        #: the gateway's uploads, by key (the store's, cached on the loop)
        self.uploaded: dict[str, StoredVoice] = {}
        #: per replica: deleted here, maybe still there (key -> name)
        self.tombstones: list[dict[str, str]] = [{} for _ in range(n)]
        #: per replica: voices it refused (4xx) since it last returned
        self.refused: list[set[str]] = [set() for _ in range(n)]
        #: per replica: reconciled since it last returned, nothing failed since
        self.synced = [False] * n
        self._locks = [asyncio.Lock() for _ in range(n)]
        self._running: dict[int, asyncio.Task[None]] = {}

    # --- lifecycle -------------------------------------------------------------------

    async def load(self, store: VoiceStore) -> None:
        self.store = store
        stored = await asyncio.to_thread(store.list)
        self.uploaded = {key_of(v.name): v for v in stored}

    async def aclose(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def deleted(self) -> set[str]:
        """Keys deleted here and maybe still held by a replica."""
        return {key for stones in self.tombstones for key in stones}

    def _routable(self) -> list[int]:
        now = self.client.clock()
        return [
            i
            for i in range(len(self.client.bases))
            if self.client.pool.state_of(i, now) is ReplicaState.READY
        ]

    # --- the gateway's uploads and deletions ------------------------------------------

    async def added(self, voice: StoredVoice, audio: bytes) -> None:
        """Copy a stored upload to every routable replica; raises
        ``GatewayError`` when none holds it."""
        key = key_of(voice.name)
        for stones in self.tombstones:
            stones.pop(key, None)
        self.uploaded[key] = voice  # a replica reconciled meanwhile gets it too
        targets = self._routable()
        results = await asyncio.gather(*(self._upload(i, voice, audio) for i in targets))
        if any(r.copy is Copy.HELD for r in results):
            return
        del self.uploaded[key]
        self._bury(key, voice.name)  # in case a reconcile copied it meanwhile
        refusals = [r.message for r in results if r.copy is Copy.REFUSED]
        if refusals:
            raise GatewayError(
                ErrorCode.INVALID_CONFIG,
                f"the upstream speech servers refused the voice: {refusals[0]}",
            )
        raise GatewayError(
            ErrorCode.BUSY,
            "no upstream speech server could store the voice now; retry shortly",
        )

    async def removed(self, voice: StoredVoice) -> None:
        """Delete a voice's copies; replicas not reached keep a tombstone."""
        key = key_of(voice.name)
        self.uploaded.pop(key, None)
        self._bury(key, voice.name)
        await asyncio.gather(*(self._delete(i, voice.name) for i in self._routable()))

    def _bury(self, key: str, name: str) -> None:
        for i, stones in enumerate(self.tombstones):
            stones.pop(key, None)
            stones[key] = name  # newest last
            while len(stones) > MAX_TOMBSTONES:
                del stones[next(iter(stones))]
            self.synced[i] = False

    # --- reconciling -------------------------------------------------------------------

    def probed(self, index: int) -> None:
        """After each probe of ``index``: forget a replica that went away;
        reconcile one that is routable and out of line."""
        if self.store is None:
            return
        now = self.client.clock()
        if self.client.pool.state_of(index, now) is not ReplicaState.READY:
            self.synced[index] = False
            self.refused[index].clear()  # asked again when it returns
            return
        if self.synced[index] and not self._drifted(index):
            return
        self.reconcile(index)

    def reconcile(self, index: int) -> None:
        """Start reconciling ``index`` (once at a time per replica)."""
        if index in self._running:
            return
        task = asyncio.get_running_loop().create_task(
            self._reconcile(index), name="upstream-voice-reconcile"
        )
        self._running[index] = task
        task.add_done_callback(lambda _: self._running.pop(index, None))

    def _drifted(self, index: int) -> bool:
        held = self.client.replica_voices[index]
        if held is None:
            return False  # not known: reconciled when it returns
        missing = set(self.uploaded) - held - self.refused[index]
        return bool(missing) or any(key in held for key in self.tombstones[index])

    async def _reconcile(self, index: int) -> None:
        name = self.client.pool.replicas[index].name
        try:
            held = await self._listing(index)
            ok = True
            for key, voice_name in list(self.tombstones[index].items()):
                if held is not None and key not in held:
                    self.tombstones[index].pop(key, None)
                    continue
                ok &= (await self._delete(index, voice_name)).copy is not Copy.FAILED
            added = 0
            for key, voice in list(self.uploaded.items()):
                if (held is not None and key in held) or key in self.refused[index]:
                    continue
                assert self.store is not None
                audio = await asyncio.to_thread(self.store.read_audio, voice)
                if audio is None:
                    continue  # deleted meanwhile
                result = await self._upload(index, voice, audio, only_if_wanted=True)
                ok &= result.copy is not Copy.FAILED
                added += result.copy is Copy.HELD
            self.synced[index] = ok
            if added:
                log.info("upstream replica %s reconciled: %d voices uploaded", name, added)
        except Exception:  # a bug must not stop later reconciles
            log.exception("reconciling the voices of upstream replica %s failed", name)

    async def _listing(self, index: int) -> frozenset[str] | None:
        """The names ``index`` holds (None: it has no listing we read)."""
        epoch = self.client.voice_epoch[index]
        try:
            async with asyncio.timeout(self.client.settings.probe_timeout_s):
                response = await self.client.http.get(self.client.bases[index] + "/v1/audio/voices")
        except (TimeoutError, httpx.HTTPError):
            return None
        if not response.is_success:
            return None
        held = held_voices(await asyncio.to_thread(parse_listing, response.content))
        if not held:
            return None
        if self.client.voice_epoch[index] == epoch:  # else an upload overtook it
            self.client.replica_voices[index] = held
        return held

    # --- one replica, one voice ---------------------------------------------------------

    async def _upload(
        self, index: int, voice: StoredVoice, audio: bytes, only_if_wanted: bool = False
    ) -> Result:
        key = key_of(voice.name)
        fields = {"name": voice.name, "consent": voice.consent}
        if voice.ref_text:
            fields["ref_text"] = voice.ref_text
        files = {"audio_sample": (f"{voice.id}.{voice.format}", audio, voice.media_type)}
        async with self._locks[index]:
            if only_if_wanted and self.uploaded.get(key) is not voice:
                return Result(Copy.HELD)  # deleted (or replaced) meanwhile: nothing to do
            result = await self._send(index, "POST", "", data=fields, files=files)
            if result.copy is Copy.HELD:
                self._held(index, key, True)
        self._note(index, key, result, f"upload of voice {voice.name!r}")
        return result

    async def _delete(self, index: int, name: str) -> Result:
        key = key_of(name)
        async with self._locks[index]:
            result = await self._send(index, "DELETE", "/" + quote(name, safe=""))
            if result.copy is not Copy.FAILED:  # deleted, or nothing to delete
                self.tombstones[index].pop(key, None)
                self._held(index, key, False)
                result = Result(Copy.HELD)
        self._note(index, key, result, f"deletion of voice {name!r}")
        return result

    async def _send(self, index: int, method: str, path: str, **kwargs: Any) -> Result:
        url = self.client.bases[index] + "/v1/audio/voices" + path
        try:
            response = await self.client.http.request(method, url, **kwargs)
        except (httpx.HTTPError, OSError) as exc:
            return Result(Copy.FAILED, f"{type(exc).__name__}")
        if response.is_success or response.status_code == 409:
            return Result(Copy.HELD)  # 409: a voice of that name is there already
        outcome = classify_status(response.status_code)
        message = _message(response)
        if outcome is Outcome.CLIENT_ERROR:
            return Result(Copy.REFUSED, message)
        return Result(Copy.FAILED, message)

    def _held(self, index: int, key: str, holds: bool) -> None:
        self.client.voice_epoch[index] += 1
        held = self.client.replica_voices[index]
        if held is None:
            return
        self.client.replica_voices[index] = held | {key} if holds else held - {key}

    def _note(self, index: int, key: str, result: Result, what: str) -> None:
        name = self.client.pool.replicas[index].name
        if result.copy is Copy.REFUSED:
            self.refused[index].add(key)
            log.warning("upstream replica %s refused the %s: %s", name, what, result.message)
        elif result.copy is Copy.FAILED:
            self.synced[index] = False  # tried again when it is next reconciled
            log.info("upstream replica %s: %s failed (%s)", name, what, result.message)


def _message(response: httpx.Response) -> str:
    """A refusal's message (``replicas.error_message``)."""
    return error_message(response.status_code, response.content)
