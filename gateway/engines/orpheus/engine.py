"""The ``orpheus`` engine: Orpheus TTS served by vLLM, SNAC decoded here.

What this module is for: adapting the parts to engine interface v2.  Each
submitted segment starts at once, as a task on the event loop (so a segment
the speaker submits ahead is generated while the previous one plays, within
the session's budget):

1. its prompt (``prompt.PromptBuilder``: the model's tokenizer, in a worker
   thread) and ``max_tokens`` (``prompt.max_tokens``);
2. one streamed ``POST /v1/completions`` to a vLLM replica of the pool
   (``client.CompletionsClient`` over the upstream engine's replica pool,
   probes and metrics), retried on another replica only before the first
   token;
3. the token ids go to the segment's ``decoder.DecodeStream``; the engine's
   one ``decoder.DecodeWorker`` thread decodes the new frames of every
   active segment in one SNAC batch per tick and delivers the audio through
   the shared delivery machinery (``delivery.DeliveredJob``), which holds the
   look-ahead bound and the session's budget.

Cancel (``SynthesisJob.cancel``, ``EngineStream.cancel``, barge-in) cancels
the segment's task: the read in progress ends and the HTTP response is
closed, so vLLM aborts the request; the decode stream is dropped.  A failure
after the first token fails the segment with a partial-audio error; the
session goes on with the next one.

Capabilities: 24 kHz, no alignment (Orpheus gives no word timings and none
are invented), no cloning, no instructions; the voices are
``orpheus.voices``.  ``speed`` is not honoured (Orpheus has no rate control).

What it must not do: load models in ``__init__``, decode on the event loop,
retry after a token arrived, download anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.engines.base import (
    Capabilities,
    Engine,
    EngineStream,
    StreamRequest,
    SynthesisError,
    VoiceInfo,
)
from gateway.engines.delivery import DeliveredJob, DeliveryStream, LiveJobs
from gateway.engines.orpheus.client import CompletionsClient
from gateway.engines.orpheus.codes import SAMPLE_RATE
from gateway.engines.orpheus.completions import Sampling, completion_body
from gateway.engines.orpheus.prompt import PromptBuilder, max_tokens
from gateway.engines.pool.probe import Prober
from gateway.engines.pool.routing import ReplicaState
from gateway.settings import OrpheusSettings, SettingsError
from gateway.text.segmenter import EMOTION_TAGS

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from gateway.engines.orpheus.decoder import DecodeWorker
    from gateway.settings import Settings

log = logging.getLogger(__name__)
# httpx logs every request's full URL at INFO, credentials included: never
logging.getLogger("httpx").setLevel(logging.WARNING)

#: tokens before the first audio: the decoder's look-ahead needs 3 frames
FIRST_AUDIO_TOKENS = 21
#: what ``typical_first_chunk_s`` assumes: one stream on a GPU-served
#: Orpheus 3B (about 100 tokens/s) plus the prompt's prefill (about 50 ms)
_TYPICAL_TOKENS_PER_S = 100.0
_TYPICAL_PREFILL_S = 0.05


def check_setup(config: OrpheusSettings) -> None:
    """What the engine needs on this host, checked when it is created (so
    ``serve`` stops at once with the reason, exit code 2): the ``orpheus``
    extra, the tokenizer and SNAC folders, a CUDA device if asked for.
    Nothing is loaded here."""
    if importlib.util.find_spec("snac") is None or importlib.util.find_spec("transformers") is None:
        raise SettingsError(
            "engine orpheus needs the `orpheus` extra (snac, transformers):"
            " pip install 'voice-gateway[orpheus]'"
        )
    if not config.tokenizer:
        raise SettingsError(
            "engine orpheus needs orpheus.tokenizer, the folder of the model's tokenizer"
            " (GATEWAY_ORPHEUS_TOKENIZER)"
        )
    if not Path(config.tokenizer).expanduser().is_dir():
        raise SettingsError(f"orpheus.tokenizer: {config.tokenizer} is not a folder")
    if not config.snac:
        raise SettingsError(
            "engine orpheus needs orpheus.snac, the folder of the SNAC 24 kHz weights"
            " (hubertsiuzdak/snac_24khz: config.json, pytorch_model.bin; GATEWAY_ORPHEUS_SNAC)"
        )
    folder = Path(config.snac).expanduser()
    if not (folder / "config.json").is_file() or not (folder / "pytorch_model.bin").is_file():
        raise SettingsError(
            f"orpheus.snac: {config.snac} has no config.json and pytorch_model.bin"
            " (the SNAC 24 kHz weights of hubertsiuzdak/snac_24khz)"
        )
    if config.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SettingsError("orpheus.device is cuda, but torch sees no usable CUDA device")


class OrpheusStream(DeliveryStream):
    """One utterance: its segments' generations, each a task of its own."""

    def __init__(self, request: StreamRequest, engine: OrpheusEngine) -> None:
        super().__init__(request, engine.live)
        self.engine = engine

    def start(self, job: DeliveredJob) -> None:
        if not job.started():
            return
        job.skip_timings()  # no alignment: none are invented
        voice = self.engine.find_voice(self.request.voice)
        if voice is None:
            raise SynthesisError(f"orpheus has no voice {self.request.voice!r}")
        if self.engine.worker is None or self.engine.prompts is None:
            raise SynthesisError("the orpheus engine is not started")
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._run(job, voice.name), name="orpheus-segment")
        self.engine.tasks.add(task)
        task.add_done_callback(self.engine.tasks.discard)

        def stop() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the task is gone
                loop.call_soon_threadsafe(task.cancel)

        job.on_cancel(stop)

    async def _run(self, job: DeliveredJob, voice: str) -> None:
        engine = self.engine
        assert engine.worker is not None and engine.prompts is not None
        t0 = time.perf_counter()
        try:
            prompt = await asyncio.to_thread(engine.prompts.ids, voice, job.text)
        except Exception as exc:  # the tokenizer failed: this segment fails alone
            log.warning("orpheus prompt failed (%s): %r", self.request.label, exc)
            job.fail("the segment's text could not be tokenized")
            return
        job.stats.add_stage("prompt_ms", (time.perf_counter() - t0) * 1e3)
        body = engine.completion_body(prompt, job.text)
        seed = next(engine.seeds)  # the keyed noise's, recorded for offline comparison
        job.stats.extra["noise_seed"] = float(seed)
        stream = engine.worker.open(job, seed=seed)
        t0 = time.perf_counter()
        try:
            result = await engine.client.generate(body, stream)
        except SynthesisError as exc:
            stream.abort()
            if not job.cancelled:
                log.warning("orpheus segment failed (%s): %s", self.request.label, exc)
            job.finish(exc)
            return
        except asyncio.CancelledError:
            stream.abort()
            job.cancel()
            raise
        except Exception as exc:  # a bug: this segment fails alone
            stream.abort()
            log.exception("orpheus segment failed (%s)", self.request.label)
            job.fail(f"synthesis failed: {type(exc).__name__}")
            return
        job.stats.extra["generate_ms"] = (time.perf_counter() - t0) * 1e3
        job.stats.extra["tokens"] = float(result.tokens)
        if result.stopped:
            stream.abort()
            return
        if result.finish_reason == "length":
            log.info(
                "orpheus segment (%s) reached max_tokens (%d): cut",
                self.request.label,
                body["max_tokens"],
            )
        stream.end()  # the worker flushes the look-ahead and finishes the job


class OrpheusEngine(Engine):
    name = "orpheus"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.config = settings.orpheus  # Settings checked that urls is not empty
        check_setup(self.config)
        self.client = CompletionsClient(self.config)
        self.prober = Prober(self.client)
        self.live = LiveJobs()
        self.tasks: set[asyncio.Task[None]] = set()
        self.seeds = itertools.count(1)
        self.prompts: PromptBuilder | None = None
        #: the served model's context length (vLLM's ``max_model_len`` in
        #: ``GET /v1/models``), once a replica answered; prompt + max_tokens
        #: must fit in it or vLLM refuses the request
        self.context_len: int | None = None
        self.worker: DecodeWorker | None = None
        self.sampling = Sampling(
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            repetition_penalty=self.config.repetition_penalty,
            seed=self.config.seed,
        )
        language = self.config.language
        language_name = "English" if language.casefold().startswith("en") else language
        self._voices = tuple(
            VoiceInfo(
                name=name,
                language=language,
                language_name=language_name,
                sample_rate=SAMPLE_RATE,
                quality="orpheus",
                engine=self.name,
                description="An Orpheus TTS voice (served by vLLM, decoded with SNAC).",
            )
            for name in self.config.voices
        )

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        self.prompts, self.worker = await asyncio.to_thread(self._load)
        if self.prober.enabled:
            await self.prober.probe_all()
            self.prober.start()
        self.context_len = await self._context_len()
        ready = sum(
            1
            for i in range(len(self.client.bases))
            if self.client.pool.state_of(i, self.client.clock()) is ReplicaState.READY
        )
        log.info(
            "orpheus: %d of %d vLLM replicas ready, %s; SNAC on %s, noise %s",
            ready,
            len(self.client.bases),
            ", ".join(r.name for r in self.client.pool.replicas),
            self.config.device,
            self.config.noise,
        )

    async def _context_len(self) -> int | None:
        """The served model's ``max_model_len`` from the first replica whose
        ``GET /v1/models`` lists it (None: none did; ``max_tokens_cap`` alone
        bounds the request then)."""
        for index, base in enumerate(self.client.bases):
            try:
                async with asyncio.timeout(self.config.probe_timeout_s):
                    response = await self.client.http.get(base + "/v1/models")
                doc = response.json() if response.is_success else None
            except Exception as exc:  # unreachable or not JSON: try the next one
                log.debug("orpheus replica %d: no model listing (%s)", index, type(exc).__name__)
                continue
            models = doc.get("data") if isinstance(doc, dict) else None
            for entry in models if isinstance(models, list) else ():
                if not isinstance(entry, dict):
                    continue
                if self.config.model and entry.get("id") != self.config.model:
                    continue
                length = entry.get("max_model_len")
                if isinstance(length, int) and length > 0:
                    log.info("orpheus: the served model's context is %d tokens", length)
                    return length
        return None

    def _load(self) -> tuple[PromptBuilder, DecodeWorker]:
        """The tokenizer, SNAC and the decode worker (blocking)."""
        import torch

        from gateway.engines.orpheus.decoder import DecodeWorker
        from gateway.vocoders.snac_stream import (
            SnacStream,
            SnacStreamDecoder,
            import_snac,
            load_snac_24khz,
        )

        config = self.config
        import_snac()
        prompts = PromptBuilder.load(Path(config.tokenizer).expanduser())
        folder = Path(config.snac).expanduser()
        device = torch.device(config.device)
        model = load_snac_24khz(folder).to(device)
        decoder = SnacStreamDecoder(model, device, noise=config.noise)
        # warm-up: one short utterance through the streamed decoder
        warm = SnacStream(decoder)
        warm.push([(0, 0, 0, 0, 0, 0, 0)] * 4)
        warm.finish()
        return prompts, DecodeWorker(decoder, config.max_pending_frames)

    async def aclose(self) -> None:
        await self.prober.aclose()
        self.live.cancel_all()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.client.aclose()
        if self.worker is not None:
            await asyncio.to_thread(self.worker.close)
            self.worker = None

    def ready(self) -> bool:
        """At least one vLLM replica is routable (``/readyz``)."""
        return self.client.pool.ready(self.client.clock())

    def model_names(self) -> Sequence[str]:
        return (self.config.model,) if self.config.model else ()

    def collectors(self) -> Sequence[Collector]:
        from gateway.engines.pool.metrics import PoolCollector

        return (PoolCollector(self.client),)

    # --- voices and capabilities ------------------------------------------------------

    def voices(self) -> Sequence[VoiceInfo]:
        return self._voices

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            sample_rates=(SAMPLE_RATE,),
            alignment=False,
            cloning=False,
            instructions=False,
            languages=(self.config.language,),
            max_concurrency=len(self.config.urls) * self.config.max_per_replica,
            typical_first_chunk_s=_TYPICAL_PREFILL_S + FIRST_AUDIO_TOKENS / _TYPICAL_TOKENS_PER_S,
            # the model's emotion tags pass the text front-end verbatim
            markup_tags=EMOTION_TAGS,
        )

    # --- requests ---------------------------------------------------------------------

    def completion_body(self, prompt: Sequence[int], text: str) -> dict[str, object]:
        """The JSON of one segment's streamed completion request."""
        config = self.config
        limit = max_tokens(
            len(text), config.seconds_per_char, config.max_tokens_base, config.max_tokens_cap
        )
        if self.context_len is not None:  # the prompt and the speech share the context
            limit = max(1, min(limit, self.context_len - len(prompt)))
        return completion_body(prompt, limit, self.sampling, config.model)

    def open_stream(self, request: StreamRequest) -> EngineStream:
        return OrpheusStream(request, self)

    def live_jobs(self) -> int:
        return len(self.live)

    def queue_depth(self) -> int:
        return self.worker.queued() if self.worker is not None else 0
