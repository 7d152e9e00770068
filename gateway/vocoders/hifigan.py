"""A HiFi-GAN generator in torch, built from a declared structure.

What this module is for: the vocoder half of a VITS/Piper voice.  The
structure (``HifiGanSpec``) and the weights come from outside (the Piper graph
reader infers both from the voice's ONNX file); this module builds the layers
and loads the weights with a strict name and shape check.  ``forward`` is the
whole-utterance decode; chunk-by-chunk decoding with carried state is
``gateway/vocoders/stateful.py``.

What it must not do: read ONNX files, phonemize, or know about sessions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional


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
