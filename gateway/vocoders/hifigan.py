"""A HiFi-GAN generator in torch, built from a declared structure, decoding a
latent (``[channels, frames]``) to audio incrementally, chunk by chunk.

What this module is for: the vocoder half of a VITS/Piper voice.  The
structure (``HifiGanSpec``) and the weights come from outside (the Piper graph
reader infers both from the voice's ONNX file); this module builds the layers,
loads the weights with a strict name and shape check, and decodes windows of
the latent with enough context on each side that the concatenated chunks equal
the whole-utterance decode.

What it must not do: read ONNX files, phonemize, or know about sessions.

Streaming scheme: a chunk ``[start, end)`` of latent frames is decoded from the
window ``[start - context, end + context]`` *cropped at the utterance edges*
(never zero-padded: the whole-utterance decode sees zeros only outside the
utterance, so cropping is what keeps the edges exact) and the output samples
of ``[start, end)`` are cut out of it.  The decoder's receptive field is about
+-11 latent frames, so 10 frames of context give float-level equality.  Torch
pays a first-call cost for every new input length, so windows are widened with
more real context (never padding) to a few standard lengths, which ``warm_up``
runs once at start.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConvSpec:
    """One convolution: ONNX initializer names and attributes."""

    weight: str
    bias: str | None
    in_channels: int
    out_channels: int
    kernel: int
    dilation: int = 1
    padding: int = 0
    stride: int = 1


@dataclass(frozen=True)
class ResBlockSpec:
    """A residual block.  ``kind`` 1: pairs (dilated conv, plain conv) per
    residual step; kind 2: one dilated conv per residual step."""

    kind: int
    convs: tuple[ConvSpec, ...]  # kind 2: one per step; kind 1: c1, c2, c1, c2 ...


@dataclass(frozen=True)
class HifiGanSpec:
    """The whole generator, as read from a graph."""

    latent_channels: int
    conv_pre: ConvSpec
    ups: tuple[ConvSpec, ...]  # ConvTranspose1d layers
    resblocks: tuple[ResBlockSpec, ...]  # num_kernels per upsampling stage
    conv_post: ConvSpec
    slope: float = 0.1  #: leaky ReLU slope inside the network
    post_slope: float = 0.01  #: leaky ReLU slope before conv_post

    @property
    def num_kernels(self) -> int:
        return len(self.resblocks) // len(self.ups)

    @property
    def hop_length(self) -> int:
        hop = 1
        for up in self.ups:
            hop *= up.stride
        return hop


class UnsupportedSpecError(ValueError):
    """The declared structure is not one this generator can build."""


def _conv(spec: ConvSpec) -> nn.Conv1d:
    return nn.Conv1d(
        spec.in_channels,
        spec.out_channels,
        spec.kernel,
        dilation=spec.dilation,
        padding=spec.padding,
        bias=spec.bias is not None,
    )


class _ResBlock(nn.Module):
    def __init__(self, spec: ResBlockSpec, slope: float) -> None:
        super().__init__()
        self.kind = spec.kind
        self.slope = slope
        self.convs = nn.ModuleList(_conv(c) for c in spec.convs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        convs = list(self.convs)
        if self.kind == 2:
            for conv in convs:
                x = conv(functional.leaky_relu(x, self.slope)) + x
            return x
        for c1, c2 in zip(convs[0::2], convs[1::2], strict=True):
            xt = c1(functional.leaky_relu(x, self.slope))
            x = c2(functional.leaky_relu(xt, self.slope)) + x
        return x


class HifiGan(nn.Module):
    """The generator: conv_pre, (leaky ReLU, upsample, mean of resblocks) per
    stage, leaky ReLU, conv_post, tanh."""

    def __init__(self, spec: HifiGanSpec) -> None:
        super().__init__()
        if spec.conv_post.out_channels != 1:
            raise UnsupportedSpecError("conv_post must have one output channel")
        if not spec.ups or len(spec.resblocks) % len(spec.ups):
            raise UnsupportedSpecError("resblocks must divide evenly among the stages")
        self.spec = spec
        self.conv_pre = _conv(spec.conv_pre)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(
                u.in_channels, u.out_channels, u.kernel, stride=u.stride, padding=u.padding
            )
            for u in spec.ups
        )
        self.resblocks = nn.ModuleList(_ResBlock(r, spec.slope) for r in spec.resblocks)
        self.conv_post = _conv(spec.conv_post)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """``z``: [batch, channels, frames] -> audio [batch, frames * hop]."""
        x = self.conv_pre(z)
        k = self.spec.num_kernels
        blocks = list(self.resblocks)
        for i, up in enumerate(self.ups):
            x = up(functional.leaky_relu(x, self.spec.slope))
            acc = blocks[i * k](x)
            for block in blocks[i * k + 1 : (i + 1) * k]:
                acc = acc + block(x)
            x = acc / k
        x = self.conv_post(functional.leaky_relu(x, self.spec.post_slope))
        return torch.tanh(x)[:, 0, :]

    def onnx_names(self) -> dict[str, str]:
        """torch parameter name -> ONNX initializer name."""
        names: dict[str, str] = {}

        def add(prefix: str, spec: ConvSpec) -> None:
            names[f"{prefix}.weight"] = spec.weight
            if spec.bias is not None:
                names[f"{prefix}.bias"] = spec.bias

        add("conv_pre", self.spec.conv_pre)
        for i, up in enumerate(self.spec.ups):
            add(f"ups.{i}", up)
        for i, block in enumerate(self.spec.resblocks):
            for j, conv in enumerate(block.convs):
                add(f"resblocks.{i}.convs.{j}", conv)
        add("conv_post", self.spec.conv_post)
        return names

    def load_onnx_weights(self, initializers: Mapping[str, np.ndarray]) -> None:
        """Load weights by ONNX initializer name; every parameter must be found
        with its exact shape (``strict``), or ``UnsupportedSpecError``."""
        state: dict[str, torch.Tensor] = {}
        own = dict(self.named_parameters())
        for param_name, onnx_name in self.onnx_names().items():
            if onnx_name not in initializers:
                raise UnsupportedSpecError(f"initializer {onnx_name!r} not found")
            value = initializers[onnx_name]
            if tuple(value.shape) != tuple(own[param_name].shape):
                raise UnsupportedSpecError(
                    f"{onnx_name}: shape {tuple(value.shape)}, expected "
                    f"{tuple(own[param_name].shape)}"
                )
            state[param_name] = torch.from_numpy(np.array(value, dtype=np.float32))
        try:
            self.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise UnsupportedSpecError(str(exc)) from None


@dataclass(frozen=True)
class ChunkWindow:
    """Decode latent frames ``[win_start, win_end)`` and keep ``[start, end)``."""

    start: int
    end: int
    win_start: int
    win_end: int


def plan_chunks(frames: int, schedule: Sequence[int], context: int) -> list[ChunkWindow]:
    """Split ``frames`` latent frames into chunks following ``schedule`` (the
    last size repeats), each with ``context`` frames on each side cropped at
    the utterance edges.  A window shorter than its standard length
    (``size + 2 * context``) is widened with more real context, so only a few
    input lengths ever reach the decoder."""
    windows: list[ChunkWindow] = []
    start = 0
    index = 0
    while start < frames:
        size = schedule[min(index, len(schedule) - 1)]
        end = min(frames, start + size)
        standard = size + (context if index == 0 else 2 * context)
        win_start = max(0, start - context)
        win_end = min(frames, end + context)
        if win_end - win_start < standard:
            win_start = max(0, min(win_start, win_end - standard))
            win_end = min(frames, max(win_end, win_start + standard))
        windows.append(ChunkWindow(start, end, win_start, win_end))
        start = end
        index += 1
    return windows


def window_lengths(schedule: Sequence[int], context: int) -> list[int]:
    """The standard window lengths ``plan_chunks`` produces (for warm-up)."""
    lengths = {schedule[0] + context}
    # the last size repeats, so it also occurs as a middle chunk
    lengths.update(size + 2 * context for size in [*schedule[1:], schedule[-1]])
    return sorted(lengths)


class StreamingHifiGan:
    """A loaded generator on a device, decoding chunk windows."""

    def __init__(self, model: HifiGan, device: torch.device) -> None:
        self.model = model.to(device).eval()
        self.device = device
        self.hop_length = model.spec.hop_length
        self.latent_channels = model.spec.latent_channels

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """Decode a whole latent ``[channels, frames]`` to float32 samples."""
        with torch.inference_mode():
            z = torch.from_numpy(np.ascontiguousarray(latent, dtype=np.float32))
            audio = self.model(z.unsqueeze(0).to(self.device))[0]
            result: np.ndarray = audio.float().cpu().numpy()
            return result

    def decode_chunk(self, latent: np.ndarray, window: ChunkWindow) -> np.ndarray:
        """Decode one chunk: the samples of ``[window.start, window.end)``."""
        audio = self.decode(latent[:, window.win_start : window.win_end])
        offset = (window.start - window.win_start) * self.hop_length
        return audio[offset : offset + (window.end - window.start) * self.hop_length]

    def decode_batch(self, latents: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Decode windows of equal length in one batch."""
        with torch.inference_mode():
            z = torch.from_numpy(np.stack(latents).astype(np.float32, copy=False))
            audio = self.model(z.to(self.device))
            return list(audio.float().cpu().numpy())

    def warm_up(self, lengths: Sequence[int]) -> None:
        """Run each window length once so the first request pays no first-call cost."""
        for length in lengths:
            self.decode(np.zeros((self.latent_channels, length), dtype=np.float32))
