"""The ``upstream`` engine: each segment is one streamed ``POST
/v1/audio/speech`` to a pool of OpenAI-compatible speech servers (vllm-omni,
OpenAI, Kokoro-FastAPI, another gateway), relayed into the session.

What this module is for: adapting the relay (``client.UpstreamClient``) to
engine interface v2.  Each utterance opens an ``UpstreamStream``; each
submitted segment starts its request at once, as a task, so a segment the
speaker submits ahead (while the previous one plays) is *prefetched*: the
upstream's own time to first audio hides behind playback.  How far ahead is
the session's budget: the shared delivery machinery (``DeliveredJob.acquire``)
refuses a chunk while the budget is full, and the relay then stops reading
the body, so the upstream is held back by TCP, not by a buffer here.  A
prefetched request holds a slot of its replica (``max_per_replica``) like
any other.

Cancel (``SynthesisJob.cancel``, ``EngineStream.cancel``) cancels the
segment's task; the read in progress ends and the response's connection is
closed, which is how the upstream learns to stop (vllm-omni aborts the
request on disconnect).

Word timings come only from the upstream, never invented: with
``upstream.word_timestamps`` a segment whose stream asks for alignment is
one whole-file request with vllm-omni 0.30's ``word_timestamps: true`` (its
HTTP API times words only on a whole file), whose ``X-Word-Timestamps``
become the segment's ``WordTimings`` before its audio; without it the engine
declares no alignment.  ``seed``, ``instructions``, ``language`` and the
cloning fields (``ref_audio``, ``ref_text``) are sent only when the
``[upstream]`` section declares the upstream supports them.  Voices are the
ones the replicas list (``GET /v1/audio/voices``, merged; a voice only some
replicas hold is routed to those), else ``upstream.voices``.  With
``upstream.cloning``, voices uploaded through the gateway are copied to
every replica and reconciled when one returns (``voices.VoiceCopies``), and
spoken by name.

What it must not do: invent timings, retry a segment after part of its audio
was delivered, or log URLs with credentials or the API key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import numpy.typing as npt

from gateway.engines.base import (
    CLONING_OPTIONS,
    Capabilities,
    EngineStream,
    StreamRequest,
    VoiceInfo,
    WordTiming,
    WordTimings,
)
from gateway.engines.delivery import DeliveredJob, wait_for_room
from gateway.engines.pool.engine import PoolEngine, PoolStream
from gateway.engines.pool.routing import ReplicaState
from gateway.engines.upstream.client import UpstreamClient
from gateway.engines.upstream.voices import VoiceCopies
from gateway.engines.upstream.wire import Format, ResponseDecoder, WireError, check_headers

if TYPE_CHECKING:
    from gateway.settings import Settings
    from gateway.voices.store import StoredVoice, VoiceStore

log = logging.getLogger(__name__)

#: text used to read the upstream's rate from a WAV header at start
_RATE_PROBE_TEXT = "Hello."

_LANGUAGE_NAMES = {
    "en": "English",
    "zh": "Chinese",
    "ja": "Japanese",
    "ko": "Korean",
    "de": "German",
    "fr": "French",
    "ru": "Russian",
    "pt": "Portuguese",
    "es": "Spanish",
    "it": "Italian",
}


class JobSink:
    """A ``client.Sink`` over one ``DeliveredJob`` (one segment, whatever
    number of requests it takes): room from the shared delivery machinery
    (look-ahead bound and budget), chunks and word timings delivered to it."""

    def __init__(self, job: DeliveredJob, rate: int) -> None:
        self.job = job
        self.rate = rate
        #: samples of the segment delivered so far (a later request's start)
        self.delivered = 0

    async def room(self, seconds: float) -> bool:
        return await wait_for_room(self.job, seconds)

    def deliver(self, samples: npt.NDArray[np.float32]) -> bool:
        if not self.job.chunk(samples):
            return False
        self.delivered += samples.size
        return True

    def timings(self, words: Sequence[WordTiming]) -> None:
        """One request's words (from its audio's start), before its audio:
        timed from the segment's start, as ``WordTimings`` are."""
        shift = self.delivered * 1000 / self.rate
        self.job.timings(
            WordTimings(
                tuple(WordTiming(w.word, w.start_ms + shift, w.end_ms + shift) for w in words)
            )
        )


class UpstreamStream(PoolStream["UpstreamEngine"]):
    """One utterance: its segments' requests, each a task of its own."""

    no_voice = "the upstream has no voice"

    def segment(self, job: DeliveredJob, voice: VoiceInfo) -> Coroutine[Any, Any, None]:
        # bounded work per item: a segment longer than ``max_item_chars`` is
        # several requests, in order, each with its own audio cap
        pieces = self.engine.work_items(job.text, self.engine.config.max_item_chars)
        bodies = [self.engine.request_body(self.request, voice, piece) for piece in pieces]
        return self._run(job, bodies, voice.sample_rate)

    async def _run(self, job: DeliveredJob, bodies: list[dict[str, Any]], rate: int) -> None:
        t0 = time.perf_counter()
        client = self.engine.client
        sink = JobSink(job, rate)
        for body in bodies:
            self.engine.record_work_item(len(str(body["input"])))
            done = await self.engine.run_segment(
                job, self.request.label, client.speak(body, rate, sink)
            )
            if done is None:
                return
        job.stats.add_stage("upstream_ms", (time.perf_counter() - t0) * 1e3)
        job.finish()


class UpstreamEngine(PoolEngine[UpstreamClient]):
    name = "upstream"

    def __init__(self, settings: Settings) -> None:
        self.config = settings.upstream  # Settings checked that urls is not empty
        super().__init__(settings, UpstreamClient(self.config))
        self._rate = self.config.native_rate
        self._configured = self._voices_from_names(self.config.voices)
        #: uploads through the gateway, copied to every replica (with cloning)
        self.copies = VoiceCopies(self.client)
        self._store: VoiceStore | None = None
        #: the rate read in progress (``_want_rate``)
        self._rate_task: asyncio.Task[None] | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start whether or not the replicas are up: the engine is ready
        (``ready``) once one replica is and the upstream's rate is known
        (``native_rate``, a replica's listing, or one WAV request to the
        first ready replica, tried again as replicas become ready)."""
        if self._store is not None and self.config.cloning:
            await self.copies.load(self._store)
            self.prober.listeners.append(self.copies.probed)
        self.prober.listeners.append(self._want_rate)
        await self.start_probes()
        if not self.prober.enabled:  # no probes: no return to see; the replicas get the uploads now
            for index in range(len(self.client.bases)):
                self.copies.probed(index)
            await self._read_rate(range(len(self.client.bases)))
            if not self.rate_known:  # no probe will say a replica is back: ask again
                self._rate_task = asyncio.get_running_loop().create_task(
                    self._read_rate_until_known(), name="upstream-rate"
                )
        if self._rate_task is not None and self.prober.enabled:
            await asyncio.gather(self._rate_task, return_exceptions=True)
        log.info("upstream pool: %s", self.replicas_ready())
        if not self.rate_known:
            log.warning(
                "the upstream's sample rate is not known yet (no replica answered):"
                " not ready until one does; set upstream.native_rate to say it"
            )

    @property
    def rate_known(self) -> bool:
        return bool(self._rate or self._listed_rates())

    def ready(self) -> bool:
        """A replica is routable and the upstream's rate is known (``/readyz``)."""
        return self.rate_known and super().ready()

    def _want_rate(self, index: int) -> None:
        """A probe listener: read the rate from ``index`` when it is ready and
        the rate is still unknown (one read at a time)."""
        if self.rate_known or (self._rate_task is not None and not self._rate_task.done()):
            return
        if self.client.pool.state_of(index, self.client.clock()) is not ReplicaState.READY:
            return
        self._rate_task = asyncio.get_running_loop().create_task(
            self._read_rate([index]), name="upstream-rate"
        )

    async def _read_rate_until_known(self) -> None:
        """Without probes: every ``probe_interval_s``, every replica, until
        one gives the rate."""
        while not self.rate_known:
            await asyncio.sleep(self.config.probe_interval_s)
            await self._read_rate(range(len(self.client.bases)))

    async def _read_rate(self, indexes: Iterable[int]) -> None:
        if self.rate_known:
            return
        for index in indexes:
            rate = await self._probe_rate(index)
            if rate:
                self._rate = rate
                self._configured = self._voices_from_names(self.config.voices)
                return

    async def close_helpers(self) -> None:
        if self._rate_task is not None:
            self._rate_task.cancel()
            await asyncio.gather(self._rate_task, return_exceptions=True)
        await self.copies.aclose()

    # --- uploaded voices ---------------------------------------------------------------

    def use_voice_store(self, store: VoiceStore) -> None:
        self._store = store

    async def voice_added(self, voice: StoredVoice, audio: bytes) -> None:
        if self.config.cloning and self.copies.store is not None:
            await self.copies.added(voice, audio)

    async def voice_removed(self, voice: StoredVoice) -> None:
        if self.config.cloning and self.copies.store is not None:
            await self.copies.removed(voice)

    # --- voices and rates ----------------------------------------------------------------

    def _language(self) -> tuple[str, str]:
        tag = self.config.languages[0]
        return tag, _LANGUAGE_NAMES.get(tag.split("-")[0].casefold(), tag)

    def _voices_from_names(self, names: Sequence[str]) -> list[VoiceInfo]:
        tag, language_name = self._language()
        return [
            VoiceInfo(
                name=name,
                language=tag,
                language_name=language_name,
                sample_rate=self._rate or 24000,
                quality="upstream",
                engine=self.name,
                description="A voice of the upstream speech servers.",
            )
            for name in names
        ]

    def _listed_rates(self) -> list[int]:
        rates = []
        for listing in self.prober.listings:
            for entry in listing or ():
                rate = entry.get("sample_rate")
                if isinstance(rate, int) and rate > 0:
                    rates.append(rate)
        return rates

    def voices(self) -> Sequence[VoiceInfo]:
        """The replicas' voices merged, then ``upstream.voices``, then (with
        cloning) the voices uploaded through the gateway, which the replicas
        speak by name.  A replica's copy of a voice uploaded or deleted
        through the gateway is not listed as its own."""
        tag, language_name = self._language()
        seen: dict[str, VoiceInfo] = {}
        ours = set(self.copies.uploaded) | self.copies.deleted()
        for listing in self.prober.listings:
            for entry in listing or ():
                name = entry["name"]
                if name.casefold() in seen or name.casefold() in ours:
                    continue
                rate = entry.get("sample_rate")
                seen[name.casefold()] = VoiceInfo(
                    name=name,
                    language=str(entry.get("language") or tag),
                    language_name=str(entry.get("language_name") or language_name),
                    sample_rate=self._rate or (rate if isinstance(rate, int) else 24000),
                    quality="upstream",
                    engine=self.name,
                    description="A voice of the upstream speech servers.",
                )
        for voice in self._configured:
            seen.setdefault(voice.name.casefold(), voice)
        own = list(seen.values()) or self._voices_from_names(["default"])
        if not self.config.cloning:
            return tuple(own)
        return (*own, *self._uploaded_voices(own))

    def _uploaded_voices(self, own: Sequence[VoiceInfo]) -> list[VoiceInfo]:
        tag, language_name = self._language()
        taken = {v.name.casefold() for v in own}
        return [
            VoiceInfo(
                name=stored.name,
                language=tag,
                language_name=language_name,
                sample_rate=self._rate or own[0].sample_rate,
                quality="upstream",
                engine=self.name,
                description="A voice uploaded to the gateway, copied to every replica.",
                uploaded=True,
            )
            for key, stored in self.copies.uploaded.items()
            if key not in taken
        ]

    @property
    def capabilities(self) -> Capabilities:
        voices = self.voices()
        rates = tuple(sorted({v.sample_rate for v in voices}))
        # the configured languages, then any a replica's listing names
        languages = dict.fromkeys([*self.config.languages, *(v.language for v in voices)])
        return Capabilities(
            sample_rates=rates,
            alignment=self.config.word_timestamps,
            seed=self.config.seed,
            cloning=self.config.cloning,
            instructions=self.config.instructions,
            speed=self.config.stream_speed,
            languages=tuple(languages),
            max_concurrency=len(self.config.urls) * self.config.max_per_replica,
            typical_first_chunk_s=0.3,
            max_work_item=self.config.max_item_chars,
            work_item_unit="characters",
        )

    async def _probe_rate(self, index: int) -> int:
        """The upstream's rate from the WAV header of a short request to
        replica ``index``; 0 when it does not give one."""
        body = {
            "input": _RATE_PROBE_TEXT,
            "voice": self.default_voice().name,
            "stream": True,
            "stream_format": "audio",
            "response_format": "wav",
            **({"model": self.config.model} if self.config.model else {}),
        }
        name = self.client.pool.replicas[index].name
        url = self.client.bases[index] + "/v1/audio/speech"
        try:
            async with (
                asyncio.timeout(self.config.first_byte_timeout_s),
                self.client.http.stream("POST", url, json=body) as response,
            ):
                if not response.is_success:
                    log.info("upstream %s: no rate (HTTP %d)", name, response.status_code)
                    return 0
                check_headers(response.headers.get("content-type"), None, "audio")
                decoder = ResponseDecoder("audio", "wav")
                async for piece in response.aiter_raw():
                    for event in decoder.push(piece):
                        if isinstance(event, Format):
                            log.info("upstream %s speaks at %d Hz", name, event.sample_rate)
                            return event.sample_rate
        except (TimeoutError, WireError, OSError, httpx.HTTPError) as exc:
            log.info("upstream %s: no rate from a WAV header (%s)", name, type(exc).__name__)
        return 0

    # --- requests ---------------------------------------------------------------------------

    def request_body(self, request: StreamRequest, voice: VoiceInfo, text: str) -> dict[str, Any]:
        """The JSON of one segment's ``POST /v1/audio/speech``."""
        config = self.config
        body: dict[str, Any] = {
            "input": text,
            "voice": voice.name,
            "stream": True,
            "stream_format": config.stream_format,
            "response_format": config.response_format,
        }
        if config.model:
            body["model"] = config.model
        if config.send_sample_rate:
            body["sample_rate"] = voice.sample_rate
        if config.stream_speed and request.speed != 1.0:
            # vllm-omni 0.30 refuses speed on a stream unless its model has
            # native speed control: sent only when the section declares it
            # (the validator refuses another speed otherwise)
            body["speed"] = request.speed
        if config.instructions and request.instructions:
            body["instructions"] = request.instructions
        if config.seed and request.seed is not None:
            body["seed"] = request.seed
        if config.word_timestamps and request.alignment:
            # vllm-omni 0.30 times words only on a whole file (a stream with
            # word_timestamps is its 400): one file, its words in a header
            body["stream"] = False
            del body["stream_format"]
            body["word_timestamps"] = True
        if config.send_language and request.language:
            # vllm-omni's spelling: the language's name ("English"), not its tag;
            # the session only lets through the voice's own language
            body["language"] = voice.language_name or request.language
        if config.cloning:
            for key in CLONING_OPTIONS:
                if key in request.options:
                    body[key] = request.options[key]
        return body

    def open_stream(self, request: StreamRequest) -> EngineStream:
        return UpstreamStream(request, self)
