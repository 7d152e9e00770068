"""One loaded Piper voice: phonemizer, acoustic sessions, vocoder, gain.

What this module is for: load a voice (``.onnx`` + ``.onnx.json``) once at
start: split and cache its graph, open the onnxruntime sessions, build the
torch HiFi-GAN when the decoder's structure is recognised and *verified*
against the ONNX decoder on a test latent (otherwise the voice decodes whole
segments in onnxruntime and is listed ``streaming: false``), warm up every
shape used at run time, and calibrate the fixed output gain.

What it must not do: schedule work or know about jobs; loading is slow and
runs off the event loop (``asyncio.to_thread``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
import torch
from piper import PiperVoice
from piper.config import PiperConfig

from gateway.engines.base import VoiceInfo
from gateway.engines.piper import graph, loudness
from gateway.engines.piper.acoustic import AcousticModel
from gateway.ops.resources import CALIBRATION_TEXT
from gateway.vocoders.hifigan import HifiGan, UnsupportedSpecError
from gateway.vocoders.stateful import ChunkWindow, StreamingHifiGan

log = logging.getLogger(__name__)

#: the torch decoder must match the ONNX decoder this closely to be used
VERIFY_TOLERANCE = 1e-3


@dataclass
class VoiceFiles:
    model: Path
    config: Path
    name: str | None = None  #: None: the file name without ``.onnx``


class LoadedVoice:
    """A voice ready to synthesize (shared by all sessions, thread-safe use)."""

    def __init__(
        self,
        files: VoiceFiles,
        cache_root: Path,
        device: torch.device,
        providers: list[str],
        threads: int,
        schedule: Sequence[int],
        light_twins: bool = False,
    ) -> None:
        self.files = files
        config_dict: dict[str, Any] = json.loads(files.config.read_text(encoding="utf-8"))
        self.config = PiperConfig.from_dict(config_dict)
        # only the phonemizer half of PiperVoice is used; inference is ours
        self.phonemizer = PiperVoice(session=None, config=self.config)
        self.sample_rate = int(self.config.sample_rate)
        self.parts = graph.split_voice(files.model, cache_root)
        self.acoustic = AcousticModel(self.parts, providers, threads, light_twins)
        self.schedule = list(schedule)
        self.vocoder: StreamingHifiGan | None = None
        self.not_streaming_reason = ""
        try:
            self.vocoder = self._build_vocoder(device)
        except (graph.UnsupportedDecoderError, UnsupportedSpecError) as exc:
            self.not_streaming_reason = str(exc)
            log.warning(
                "voice %s: decoder not ported (%s); whole-segment ONNX decode",
                files.model.name,
                exc,
            )
        self.hop_length = (
            self.vocoder.hop_length if self.vocoder is not None else int(self.config.hop_length)
        )
        self.gain = 1.0
        self.info = _voice_info(files, config_dict, streaming=self.vocoder is not None)

    @property
    def streaming(self) -> bool:
        return self.vocoder is not None

    def _build_vocoder(self, device: torch.device) -> StreamingHifiGan:
        model = onnx.load(str(self.parts.decoder))
        if self.parts.points.decoder_extra:
            raise graph.UnsupportedDecoderError("decoder reads inputs besides the latent")
        spec = graph.infer_hifigan(model)
        generator = HifiGan(spec)
        generator.load_onnx_weights(graph.decoder_weights(model))
        vocoder = StreamingHifiGan(generator, device)
        probe = np.random.default_rng(0).standard_normal((spec.latent_channels, 24))
        probe = probe.astype(np.float32)
        error = float(np.abs(vocoder.decode(probe) - self.acoustic.decode_onnx(probe)).max())
        if not error <= VERIFY_TOLERANCE:
            raise graph.UnsupportedDecoderError(f"torch decoder differs from ONNX by {error:.2e}")
        return vocoder

    # --- text -------------------------------------------------------------------

    def phonemize(self, text: str) -> list[str]:
        """Phonemes of the whole segment (sentences joined by a space)."""
        sentences = [s for s in self.phonemizer.phonemize(text) if s]
        phonemes: list[str] = []
        for sentence in sentences:
            if phonemes:
                phonemes.append(" ")
            phonemes.extend(sentence)
        return phonemes

    def word_phonemes(self, words: Sequence[str]) -> list[list[str]]:
        return [self.phonemize(word) for word in words]

    def scales(self, speed: float, deterministic: bool) -> tuple[float, float, float]:
        length = float(self.config.length_scale) / max(speed, 0.1)
        if deterministic:
            return (0.0, length, 0.0)
        return (float(self.config.noise_scale), length, float(self.config.noise_w_scale))

    # --- audio ------------------------------------------------------------------

    def plan(self, frames: int, merge: int = 0) -> list[ChunkWindow]:
        """The chunks of a segment of ``frames`` latent frames, the first
        ``merge + 1`` chunks of the schedule made one (see ``job.py``: when
        other utterances start at the same time, a larger first chunk comes a
        little later but gives its listener the runway of several while the
        next chunks queue behind the other sessions' work)."""
        if self.vocoder is None:
            return [ChunkWindow(0, frames, 0, frames)]
        return self.vocoder.plan(frames, self._schedule(merge))

    def _schedule(self, merge: int) -> list[int]:
        schedule = self.schedule
        if merge > 0 and len(schedule) > 1:
            n = min(len(schedule), merge + 1)
            # the steady (last) size still repeats after the merged chunk
            schedule = [sum(schedule[:n]), *(schedule[n:] or schedule[-1:])]
        return schedule

    def open_decoder(self, frames: int, extras: dict[str, np.ndarray]) -> ChunkSource:
        """One segment's decoder: ``decode_chunk(latent, window)`` returns the
        raw (un-gained) samples of each window of ``plan(frames)`` in turn."""
        if self.vocoder is None:
            return _WholeSegment(self.acoustic, extras)
        return self.vocoder.open(frames)

    def synthesize_offline(self, text: str, speed: float = 1.0) -> list[np.ndarray]:
        """Deterministic whole-segment synthesis per sentence, without gain
        (calibration and tests)."""
        out: list[np.ndarray] = []
        for sentence in self.phonemizer.phonemize(text):
            if not sentence:
                continue
            ids = self.phonemizer.phonemes_to_ids(sentence)
            encoded = self.acoustic.encode(ids, self.scales(speed, deterministic=True))
            latent = self.acoustic.flow_whole(encoded)
            out.append(self.acoustic.decode_onnx(latent, encoded.extras))
        return out

    def warm_up(self, thread_counts: Sequence[int] = (), max_merge: int = 0) -> None:
        """Run every shape used at run time once (torch pays per new length
        and thread count): the plans of ``plan(frames, merge)`` for each
        merge up to ``max_merge``, under each of ``thread_counts`` (the
        current count when empty)."""
        ids = self.phonemizer.phonemes_to_ids(self.phonemize("Warm up."))
        encoded = self.acoustic.encode(ids, self.scales(1.0, deterministic=True))
        self.acoustic.flow_whole(encoded)
        if self.vocoder is None:
            return
        before = torch.get_num_threads()
        try:
            for threads in thread_counts or [before]:
                torch.set_num_threads(threads)
                for merge in range(max_merge + 1):
                    self.vocoder.warm_up(self._schedule(merge))
        finally:
            torch.set_num_threads(before)

    def calibrate(self, cache_root: Path) -> None:
        """Set ``gain`` from the calibration text, cached beside the sub-models."""
        text = CALIBRATION_TEXT.read_text(encoding="utf-8")
        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        path = cache_root / self.parts.sha256 / f"gain-{key}.json"
        try:
            self.gain = float(json.loads(path.read_text(encoding="utf-8"))["gain"])
            return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        sentences = self.synthesize_offline(text)
        self.gain = loudness.calibrate_gain(sentences, self.sample_rate)
        path.write_text(json.dumps({"gain": self.gain, "text_sha256": key}), encoding="utf-8")
        log.info(
            "voice %s: output gain %.3f (%.2f dB)",
            self.info.name,
            self.gain,
            20 * np.log10(self.gain),
        )


class ChunkSource(Protocol):
    def decode_chunk(self, latent: np.ndarray, window: ChunkWindow) -> np.ndarray: ...


class _WholeSegment:
    """Whole-segment ONNX decode, for voices the torch port cannot serve."""

    def __init__(self, acoustic: AcousticModel, extras: dict[str, np.ndarray]) -> None:
        self.acoustic = acoustic
        self.extras = extras

    def decode_chunk(self, latent: np.ndarray, window: ChunkWindow) -> np.ndarray:
        return self.acoustic.decode_onnx(latent[:, window.start : window.end], self.extras)


def _voice_info(files: VoiceFiles, config: dict[str, Any], streaming: bool) -> VoiceInfo:
    language = config.get("language", {})
    code = str(language.get("code") or config.get("espeak", {}).get("voice", "und"))
    bcp47 = code.replace("_", "-")
    english = str(language.get("name_english") or bcp47)
    name = files.name or files.model.name.removesuffix(".onnx")
    aliases = tuple(dict.fromkeys(a for a in (code, english) if a != bcp47))
    return VoiceInfo(
        name=name,
        language=bcp47,
        language_name=english,
        sample_rate=int(config["audio"]["sample_rate"]),
        quality=str(config["audio"].get("quality", "medium")),
        streaming=streaming,
        engine="piper",
        description=f"Piper voice {config.get('dataset', name)}",
        language_aliases=aliases,
    )
