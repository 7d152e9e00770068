"""The acoustic half of a Piper voice in onnxruntime: phoneme ids to latent.

What this module is for: run sub-model (a) (text encoder + duration predictor,
with the noise and length scales) and sub-model (b) (the flow) on windows of
the latent, the first window first, so the decoder can start before the flow
has finished.  Also the whole-segment ONNX decode for voices whose decoder the
torch port cannot reproduce.

What it must not do: touch torch, or block the event loop (it runs in the
engine's acoustic worker thread).  A cancelled segment's run is stopped with
``RunOptions.terminate`` rather than awaited.

Flow windowing: the flow is four coupling layers, each a WaveNet of four
convolutions with kernel 5 and dilation 1, so its receptive field is +-32
latent frames, but the influence of far frames fades fast.  A window
``[start, end)`` is computed from ``[start - 20, end + 20]`` cropped at the
utterance edges: measured against the whole flow on three sentences (noise
on), the worst latent SNR was 103 dB with 20 frames of context (76 dB with
16, 137 dB with the full 32), and it saves a fifth of the first window's
time and 24 frames of recomputation at each window boundary.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from gateway.engines.piper.graph import VoiceParts
from gateway.settings import SettingsError

log = logging.getLogger(__name__)

#: latent frames of flow context on each side (see the module docstring)
FLOW_CONTEXT_FRAMES = 20


#: what to do when ``onnx_provider = "cuda"`` cannot be honoured
CUDA_PROVIDER_HINT = (
    "install onnxruntime-gpu in place of the CPU onnxruntime (ACCELERATOR=cuda"
    " scripts/setup, docs/gpu.md), or set piper.onnx_provider to auto or cpu"
)


def onnx_providers(choice: str) -> list[str]:
    """``auto``: CUDA when the onnxruntime-gpu package offers it, else CPU
    (logged); ``cuda``: CUDA or a ``SettingsError`` at start, never a silent
    CPU fallback."""
    available = ort.get_available_providers()
    if choice in ("auto", "cuda") and "CUDAExecutionProvider" in available:
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    elif choice == "cuda":
        raise SettingsError(
            f"piper.onnx_provider=cuda, but the installed onnxruntime {ort.__version__} offers no"
            f" CUDA provider (it has {', '.join(available)}): {CUDA_PROVIDER_HINT}"
        )
    else:
        providers = ["CPUExecutionProvider"]
    log.info(
        "piper.onnx_provider=%s: acoustic models on %s (onnxruntime %s offers %s)",
        choice,
        providers[0],
        ort.__version__,
        ", ".join(available),
    )
    return providers


def check_session_providers(choice: str, session: ort.InferenceSession) -> None:
    """onnxruntime falls back to the CPU when the CUDA provider fails to load
    (missing CUDA libraries): a ``SettingsError`` under ``cuda``, a warning
    under ``auto``."""
    running = session.get_providers()
    if "CUDAExecutionProvider" in running or choice == "cpu":
        return
    if choice == "cuda":
        raise SettingsError(
            f"piper.onnx_provider=cuda, but onnxruntime could not start its CUDA provider"
            f" (the session runs on {', '.join(running)}; its log says why): {CUDA_PROVIDER_HINT}"
        )
    if "CUDAExecutionProvider" in ort.get_available_providers():
        log.warning(
            "piper.onnx_provider=auto: the CUDA provider is installed but did not start;"
            " acoustic models run on %s",
            ", ".join(running),
        )


def make_session(path: Path, providers: list[str], threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # spinning threads fight the torch pool on a small machine: measured 2x latency
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    # every segment has new input shapes (phoneme count, latent frames): the
    # CPU arena keeps its high-water mark for good and the memory pattern is
    # planned and cached per shape, so both only grow.  Measured in one
    # process, 150 encoder + flow runs on random cuts of the harness corpus:
    # +35 MiB with both, +1.3 MiB with neither (per-run times within the
    # noise of the loaded 2-core machine)
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    return ort.InferenceSession(str(path), options, providers=providers)


@dataclass
class Encoded:
    """Output of the encoder sub-model for one segment."""

    z_p: np.ndarray  #: [C, frames], flow input
    durations: np.ndarray  #: frames per phoneme id, int64 [ids]
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def frames(self) -> int:
        return int(self.z_p.shape[1])


@dataclass(frozen=True)
class LatentWindow:
    """Latent frames ``[start, end)`` that one flow run computes (not the
    session's flow-control window, ``gateway.flow``)."""

    start: int
    end: int


#: frames the second flow window covers: enough for the second and third
#: decode chunks with the default schedule, so they need not wait for the
#: flow of a long segment's whole remainder
SECOND_FLOW_WINDOW = 96
#: the most frames a later flow window covers (about 3 s of audio at 22,050
#: Hz): each window is one work item of the acoustic worker, which no other
#: session's work can overtake once it runs (``docs/engine.md``, "Bounded
#: work per item"); each extra window costs 2 x context of recomputation,
#: 16 % at this size
MAX_FLOW_WINDOW = 256


def plan_flow_windows(
    frames: int, first: int, second: int = SECOND_FLOW_WINDOW, most: int = MAX_FLOW_WINDOW
) -> list[LatentWindow]:
    """The first window covers what the first decode chunk needs, the second
    the next ``second`` frames, then windows of at most ``most`` frames to
    the end (each extra window costs 2 x context of compute; without the
    middle one the second chunk of a long segment waited for the whole
    remaining flow and played late)."""
    first = max(1, min(frames, first))
    windows = [LatentWindow(0, first)]
    middle = min(frames, first + second)
    if first < middle:
        windows.append(LatentWindow(first, middle))
    start = middle
    while start < frames:
        end = min(frames, start + max(1, most))
        windows.append(LatentWindow(start, end))
        start = end
    return windows


class AcousticModel:
    """Encoder and flow sessions of one voice (shared by all its segments)."""

    def __init__(
        self, parts: VoiceParts, providers: list[str], threads: int, light_twins: bool = False
    ) -> None:
        self.parts = parts
        self.points = parts.points
        self._providers = providers
        self._threads = threads
        self.encoder = make_session(parts.encoder, providers, threads)
        self.flow = make_session(parts.flow, providers, threads)
        # one-thread twins, for when the decoder is working too (threads.py);
        # ``light=True`` uses the ordinary sessions where there are none
        self._light = (
            (make_session(parts.encoder, providers, 1), make_session(parts.flow, providers, 1))
            if light_twins and threads > 1
            else (self.encoder, self.flow)
        )
        self._decoder: ort.InferenceSession | None = None
        self._input_names = {i.name for i in self.encoder.get_inputs()}

    @property
    def decoder(self) -> ort.InferenceSession:
        """The ONNX decoder sub-model (fallback decode, calibration, tests)."""
        if self._decoder is None:
            self._decoder = make_session(self.parts.decoder, self._providers, self._threads)
        return self._decoder

    def encode(
        self,
        phoneme_ids: Sequence[int],
        scales: tuple[float, float, float],
        speaker_id: int | None = None,
        run_options: ort.RunOptions | None = None,
        light: bool = False,
        rng: np.random.Generator | None = None,
    ) -> Encoded:
        """``scales``: (noise_scale, length_scale, noise_w_scale).  On a
        seedable voice (``SplitPoints.seedable``) both noises are drawn from
        ``rng`` (a fresh unseeded one when None): a seeded generator gives
        the same durations and latent every time."""
        feeds: dict[str, np.ndarray] = {
            "input": np.array([phoneme_ids], dtype=np.int64),
            "input_lengths": np.array([len(phoneme_ids)], dtype=np.int64),
            "scales": np.array(scales, dtype=np.float32),
        }
        points = self.points
        seeded = points.seedable and points.duration_noise in self._input_names
        if seeded:
            assert points.duration_noise is not None
            rng = rng if rng is not None else np.random.default_rng()
            feeds[points.duration_noise] = rng.standard_normal(
                (1, 2, len(phoneme_ids)), dtype=np.float32
            )
            # the graph's own latent noise is scaled to nothing: added below
            feeds["scales"] = np.array((0.0, scales[1], scales[2]), dtype=np.float32)
        if "sid" in self._input_names:
            feeds["sid"] = np.array([speaker_id or 0], dtype=np.int64)
        names = [o.name for o in self.encoder.get_outputs()]
        session = self._light[0] if light else self.encoder
        outputs = dict(zip(names, session.run(names, feeds, run_options), strict=True))
        z_p = outputs.pop(self.points.flow_input)[0]
        outputs.pop(self.points.mask)
        durations = outputs.pop(self.points.durations).reshape(-1).astype(np.int64)
        if seeded:
            assert points.latent_std is not None and rng is not None
            std = outputs.pop(points.latent_std)[0]
            if scales[0]:
                noise = rng.standard_normal(std.shape, dtype=np.float32)
                z_p = z_p + noise * std * np.float32(scales[0])
        return Encoded(z_p=z_p, durations=durations, extras=outputs)

    def flow_window(
        self,
        encoded: Encoded,
        window: LatentWindow,
        context: int = FLOW_CONTEXT_FRAMES,
        run_options: ort.RunOptions | None = None,
        light: bool = False,
    ) -> np.ndarray:
        """Latent frames ``[window.start, window.end)`` as [C, frames]."""
        lo = max(0, window.start - context)
        hi = min(encoded.frames, window.end + context)
        z = encoded.z_p[None, :, lo:hi]
        feeds = {
            self.points.flow_input: np.ascontiguousarray(z),
            self.points.mask: np.ones((1, 1, hi - lo), dtype=np.float32),
        }
        for name in self.points.flow_extra:
            feeds[name] = encoded.extras[name]
        session = self._light[1] if light else self.flow
        latent = session.run(None, feeds, run_options)[0][0]
        return np.asarray(latent[:, window.start - lo : window.end - lo], dtype=np.float32)

    def flow_whole(self, encoded: Encoded) -> np.ndarray:
        return self.flow_window(encoded, LatentWindow(0, encoded.frames), context=0)

    def decode_onnx(
        self,
        latent: np.ndarray,
        extras: dict[str, np.ndarray] | None = None,
        run_options: ort.RunOptions | None = None,
    ) -> np.ndarray:
        """Whole-segment decode with the ONNX decoder sub-model -> float32 samples."""
        feeds = {self.points.latent: np.ascontiguousarray(latent[None], dtype=np.float32)}
        for name in self.points.decoder_extra:
            feeds[name] = (extras or {})[name]
        audio = np.asarray(self.decoder.run(None, feeds, run_options)[0])
        # [1, 1, samples] normally; keep the first channel of anything wider
        first: np.ndarray = audio.reshape(-1, audio.shape[-1])[0].astype(np.float32)
        return first
