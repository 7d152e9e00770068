"""The ``orpheus`` engine: Orpheus TTS served by vLLM, SNAC decoded here.

What this module is for: adapting the parts to engine interface v2.  Each
submitted segment starts at once, as a task on the event loop (so a segment
the speaker submits ahead is generated while the previous one plays, within
the session's budget):

0. its engine text cut into items of at most ``item_chars`` characters
   (``orpheus.max_item_chars``, bounded work per item; ``PoolEngine.
   work_items``), each its own completion (steps 1 and 2), one after
   another, all feeding the segment's one decode stream (step 3), so the
   audio runs on across the seams;
1. its prompt (``prompt.PromptBuilder``: the model's tokenizer, in a worker
   thread) and ``max_tokens`` (``prompt.max_tokens``);
2. one streamed ``POST /v1/completions`` to a vLLM replica of the pool
   (``client.CompletionsClient`` over the replica pool, ``gateway.engines.pool``:
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
``orpheus.voices``.  ``speed`` is not declared (Orpheus has no rate
control), so a speed other than 1.0 is refused.  ``max_work_item`` is
``item_chars`` characters.

What it must not do: load models in ``__init__``, decode on the event loop,
retry after a token arrived, download anything.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import logging
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.engines.base import (
    Capabilities,
    EngineStream,
    StreamRequest,
    SynthesisError,
    VoiceInfo,
)
from gateway.engines.delivery import DeliveredJob
from gateway.engines.orpheus.client import CompletionsClient
from gateway.engines.orpheus.codes import SAMPLE_RATE
from gateway.engines.orpheus.completions import Sampling, completion_body
from gateway.engines.orpheus.prompt import PromptBuilder, item_chars, max_tokens
from gateway.engines.orpheus.settings import OrpheusSettings
from gateway.engines.orpheus.tags import EMOTION_TAGS
from gateway.engines.pool.engine import PoolEngine, PoolStream
from gateway.errors import SettingsError

if TYPE_CHECKING:
    from gateway.engines.orpheus.decoder import DecodeStream, DecodeWorker
    from gateway.settings import Settings

log = logging.getLogger(__name__)

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


class OrpheusStream(PoolStream["OrpheusEngine"]):
    """One utterance: its segments' generations, each a task of its own."""

    no_voice = "orpheus has no voice"

    def segment(self, job: DeliveredJob, voice: VoiceInfo) -> Coroutine[Any, Any, None]:
        if self.engine.worker is None or self.engine.prompts is None:
            raise SynthesisError("the orpheus engine is not started")
        # bounded work per item: a segment longer than the item bound is
        # several completions, one after another, decoded as one stream
        pieces = self.engine.work_items(job.text, self.engine.item_chars)
        return self._run(job, voice.name, pieces)

    async def _run(self, job: DeliveredJob, voice: str, pieces: list[str]) -> None:
        engine = self.engine
        assert engine.worker is not None and engine.prompts is not None
        seed = next(engine.seeds)  # the keyed noise's, recorded for offline comparison
        job.stats.extra["noise_seed"] = float(seed)
        stream = engine.worker.open(job, seed=seed)
        try:
            await self._items(job, voice, pieces, stream)
        except asyncio.CancelledError:  # cancelled between requests (a prompt): drop it too
            stream.abort()
            raise

    async def _items(
        self, job: DeliveredJob, voice: str, pieces: list[str], stream: DecodeStream
    ) -> None:
        """Each piece's completion into ``stream``, in order; ends the
        stream (or the job, on a failure or a stop)."""
        engine = self.engine
        assert engine.prompts is not None
        tokens = 0
        generate_ms = 0.0
        for index, piece in enumerate(pieces):
            if index:
                stream.next_item()
            t0 = time.perf_counter()
            try:
                prompt = await asyncio.to_thread(engine.prompts.ids, voice, piece)
            except Exception as exc:  # the tokenizer failed: this segment fails alone
                log.warning("orpheus prompt failed (%s): %r", self.request.label, exc)
                stream.abort()
                job.fail("the segment's text could not be tokenized")
                return
            job.stats.add_stage("prompt_ms", (time.perf_counter() - t0) * 1e3)
            body = engine.completion_body(prompt, piece)
            engine.record_work_item(len(piece))
            t0 = time.perf_counter()
            done = await engine.run_segment(
                job, self.request.label, engine.client.generate(body, stream), stream.abort
            )
            if done is None:
                return
            (result,) = done
            generate_ms += (time.perf_counter() - t0) * 1e3
            tokens += result.tokens
            if result.stopped:
                stream.abort()
                return
            if result.finish_reason == "length":
                log.info(
                    "orpheus segment (%s) reached max_tokens (%d): cut",
                    self.request.label,
                    body["max_tokens"],
                )
        job.stats.extra["generate_ms"] = generate_ms
        job.stats.extra["tokens"] = float(tokens)
        job.stats.extra["items"] = float(len(pieces))
        stream.end()  # the worker flushes the look-ahead and finishes the job


class OrpheusEngine(PoolEngine[CompletionsClient]):
    name = "orpheus"

    def __init__(self, settings: Settings) -> None:
        self.config = settings.orpheus  # Settings checked that urls is not empty
        check_setup(self.config)
        super().__init__(settings, CompletionsClient(self.config))
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
        await self.start_probes()
        self.context_len = await self._context_len()
        if self.item_chars < self.config.max_item_chars:
            log.warning(
                "orpheus: an item carries at most %d characters, not orpheus.max_item_chars"
                " (%d): max_tokens_cap (%d) or the served context (%s tokens) holds no more",
                self.item_chars,
                self.config.max_item_chars,
                self.config.max_tokens_cap,
                self.context_len,
            )
        log.info(
            "orpheus: vLLM %s; SNAC on %s, noise %s",
            self.replicas_ready(),
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
        await super().aclose()
        if self.worker is not None:
            await asyncio.to_thread(self.worker.close)
            self.worker = None

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
            # Orpheus has no rate control: a speed other than 1.0 is refused,
            # not ignored
            speed=False,
            max_work_item=self.item_chars,
            work_item_unit="characters",
        )

    @property
    def item_chars(self) -> int:
        """The most characters one completion carries: ``max_item_chars``,
        lowered where ``max_tokens_cap`` or the served model's context would
        cut an item that long (``prompt.item_chars``)."""
        config = self.config
        return item_chars(
            config.max_item_chars,
            self.context_len,
            config.seconds_per_char,
            config.max_tokens_base,
            config.max_tokens_cap,
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

    def queue_depth(self) -> int:
        return self.worker.queued() if self.worker is not None else 0
