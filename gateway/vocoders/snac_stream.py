"""SNAC (24 kHz) decode with carried state, batched across streams.

What this module is for: decoding Orpheus' SNAC frames as they arrive, each
new frame costing one frame of work, exactly equal to SNAC's whole-utterance
decode, for one stream or a batch of streams whose members join and leave.

The model.  ``SNAC()``'s defaults are the 44.1 kHz music model (with local
attention); Orpheus uses ``hubertsiuzdak/snac_24khz``, whose configuration is
``SNAC_24KHZ_CONFIG`` below and is always passed explicitly: hop 512 samples,
three code levels with temporal strides 4, 2 and 1 latent frames (so one
7-token Orpheus frame is 4 latent frames, 2048 samples, 85.3 ms), a decoder of
a depthwise 7-tap convolution and a 1x1 convolution (768 -> 1024 channels),
four blocks (snake, transposed convolution of stride 8, 8, 4, 2 and kernel
2 x stride, a noise block, three residual units with 7-tap depthwise
convolutions of dilation 1, 3, 9), then snake, a 7-tap convolution and tanh.
No attention (``attn_window_size`` is None).

Codes -> latent.  Each level's code is embedded (8 dims), projected to 768
channels and repeated over its stride; a frame's 4 latent frames depend only
on that frame's 7 codes, so this part is stateless per frame.

Carried state.  Activations are channel-major ``[batch, channels, time]``.
Every layer is streamed as a fixed delay: a convolution of span ``d(k-1)``
keeps the last ``span`` input samples (its state has the same size whatever
the stream's age, so streams of any age stack into one batch), which delays
its output by ``span / 2`` samples; a transposed convolution (polyphase form,
as in ``stateful.py``) keeps its last input column; a residual unit keeps the
``3 d`` inputs its branch has not caught up with.  Where the whole-utterance
decode pads a layer's input with zeros (before the start and after the end),
the streamed layer's output is masked to zero at those positions, which is
what makes the streamed result exact.  The delays add up to the decoder's
look-ahead:

    lookahead = 4757 samples (198 ms, 9.3 latent frames, 2.32 Orpheus frames)

So after ``n`` frames have arrived, the audio up to ``2048 n - 4757`` samples
is final and is returned; the first samples come out with the 3rd frame
(1387 samples), and the audio of frame ``k`` is complete once frame ``k + 3``
has arrived.  In latency: at real-time generation (one frame per 85.3 ms) the
output trails the tokens by 198 ms of audio; the first audio needs 21 tokens
where the usual sliding-window recipe (decode 4 frames, keep the 2nd) needs
28, and that recipe is not exact (its right context, 2 frames = 4096 samples,
is shorter than the look-ahead).  ``finish`` flushes the last 4757 samples.

Noise.  SNAC's noise blocks add ``randn * linear(x)`` with fresh noise on
every call, so any chunking (and two decodes of the same codes) differ.  Two
modes: ``"keyed"`` draws the noise from a counter-based hash of (stream seed,
block, sample position) so it depends on the position only, never on the
chunking; ``"off"`` leaves the noise out.  Production uses ``"keyed"`` (the
model was trained with its noise; keyed noise keeps that and stays exact and
reproducible per seed).  ``decode_offline`` is the whole-utterance reference
in either mode, built from SNAC's own modules.

Kernels.  1x1 and transposed convolutions run as GEMMs (time-major, one
``linear`` over every row and column); the 7-tap depthwise ones through
oneDNN directly on the CPU (torch's dispatch picks slow reference kernels
for small inputs), cuDNN on CUDA.  State tensors are updated in place, so a
steady batch's tick can be captured as a CUDA graph (``snac_graph.py``).

What it must not do: pad with zeros anywhere but the utterance's edges, keep
state across utterances (a stream is one utterance), download anything, or
be used from two threads at once.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional

#: hubertsiuzdak/snac_24khz's config.json, the model Orpheus was trained with
SNAC_24KHZ_CONFIG: Final[dict[str, Any]] = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}
#: the keys a weights folder's config.json must agree on
_DECODER_KEYS: Final = (
    "sampling_rate",
    "decoder_dim",
    "decoder_rates",
    "attn_window_size",
    "codebook_size",
    "codebook_dim",
    "vq_strides",
    "depthwise",
)
LATENT_PER_FRAME: Final = 4  #: latent frames per 7-token Orpheus frame
#: frame position -> (level, index within the frame's codes of that level)
_LEVEL_POSITIONS: Final = ((0,), (1, 4), (2, 3, 5, 6))

NoiseMode = Literal["off", "keyed"]
#: a ``snac.SNAC`` or one of its modules (snac ships no type hints)
SnacModule = Any
Frame = Sequence[int]  #: 7 codes in Orpheus position order


class UnsupportedSnacError(ValueError):
    """The model is not the 24 kHz SNAC layout this decoder streams."""


def import_snac() -> Any:
    """The ``snac`` package.  Its ``layers`` module calls ``torch.jit.script``
    at import, which recent torch reports as deprecated: that one warning is
    silenced here (it is snac's, and says nothing about this use)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.script", category=DeprecationWarning)
        import snac
        import snac.layers
    return snac


def build_snac_24khz(noise: bool = True) -> nn.Module:
    """An (untrained) SNAC with the 24 kHz configuration, passed explicitly."""
    SNAC = import_snac().SNAC

    model: nn.Module = SNAC(**{**SNAC_24KHZ_CONFIG, "noise": noise})
    return model.eval()


def load_snac_24khz(folder: Path) -> nn.Module:
    """SNAC 24 kHz weights from a local folder in ``from_pretrained`` layout
    (``config.json``, ``pytorch_model.bin``).  Nothing is downloaded."""
    config = json.loads((folder / "config.json").read_text())
    for key in _DECODER_KEYS:
        if config.get(key) != SNAC_24KHZ_CONFIG[key]:
            raise UnsupportedSnacError(f"{folder}: config.json {key} is not the 24 kHz SNAC's")
    model = build_snac_24khz(noise=bool(config.get("noise", True)))
    state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


# --- keyed noise -------------------------------------------------------------

_MASK32: Final = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix on int64 tensors (products stay below 2**63)."""
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _MASK32
    return x ^ (x >> 16)


def keyed_noise(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Standard normal noise ``[rows, n]`` that depends only on each row's key
    (int64 ``[rows]``) and the sample positions (int64 ``[rows, n]``): a
    counter-based hash, then Box-Muller on two 24-bit uniforms."""
    base = _hash32(keys & _MASK32)[:, None]
    pos = (positions * 2) & _MASK32
    h1 = _hash32(_hash32(pos) ^ base) >> 8
    h2 = _hash32(_hash32(pos + 1) ^ base) >> 8
    u1 = (h1.to(torch.float32) + 1.0) * (1.0 / 2**24)
    u2 = h2.to(torch.float32) * (1.0 / 2**24)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2 * math.pi) * u2)


def _noise_key(seed: int, block: int) -> int:
    return seed * 8 + block


# --- the streamed layers -------------------------------------------------------


@dataclass
class _Call:
    """One push to a group of rows: where each row is, in latent frames."""

    start: list[int]  #: latent frames each row had pushed before
    end: list[int | None]  #: each row's length in latent frames, once known
    frames: int  #: latent frames this push (all rows alike)
    device: torch.device
    seeds: list[int] = field(default_factory=list)
    #: the same as tensors on the device (given: a CUDA graph's static inputs)
    start_t: torch.Tensor | None = None
    seeds_t: torch.Tensor | None = None
    _end_t: torch.Tensor | None = None

    def noise_keys(self, block: int) -> torch.Tensor:
        if self.seeds_t is None:
            self.seeds_t = torch.tensor(self.seeds, dtype=torch.int64, device=self.device)
        return self.seeds_t * 8 + block  # _noise_key, on the device

    def _positions(self, rate: int, delay: int, n: int) -> torch.Tensor:
        if self.start_t is None:
            self.start_t = torch.tensor(self.start, dtype=torch.int64, device=self.device)
        steps = torch.arange(n, dtype=torch.int64, device=self.device)
        return (self.start_t * rate - delay)[:, None] + steps

    def mask(self, x: torch.Tensor, rate: int, delay: int) -> torch.Tensor:
        """Zero the samples of ``x`` (``rate`` per latent frame, ``delay``
        behind) that lie outside each row's utterance."""
        n = x.shape[-1]
        before = min(self.start) * rate - delay < 0
        after = any(
            e is not None and (s + self.frames) * rate - delay > e * rate
            for s, e in zip(self.start, self.end, strict=True)
        )
        if not (before or after):
            return x
        pos = self._positions(rate, delay, n)
        outside = pos < 0
        if after:
            if self._end_t is None:
                big = 1 << 40
                ends = [big if e is None else e for e in self.end]
                self._end_t = torch.tensor(ends, dtype=torch.int64, device=self.device)
            outside |= pos >= (self._end_t * rate)[:, None]
        return x.masked_fill(outside[:, None, :], 0.0)


_MKLDNN = bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
_mkldnn_conv = torch.ops.aten.mkldnn_convolution


def _conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int = 1,
    groups: int = 1,
) -> torch.Tensor:
    """An unpadded convolution of ``x`` [B, in, T].  On the CPU oneDNN is
    called directly: torch's own dispatch sends small inputs (every
    streamed step is small) to its slow reference kernels, measured 2-3x
    slower here (as in ``stateful.py``)."""
    if x.device.type == "cpu" and _MKLDNN:
        out: torch.Tensor = _mkldnn_conv(
            x[:, :, None, :], weight[:, :, None, :], bias, [0, 0], [1, 1], [1, dilation], groups
        )
        return out[:, :, 0, :]
    return functional.conv1d(x, weight, bias, dilation=dilation, groups=groups)


def _pointwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A 1x1 convolution of ``x`` [B, in, T] as one GEMM, time-major (MKL's
    best shape for a few columns; oneDNN re-lays big weights out per call)."""
    rows, _, n = x.shape
    flat = x.transpose(1, 2).reshape(rows * n, -1)
    return functional.linear(flat, weight, bias).view(rows, n, -1).transpose(1, 2)


def _snake(x: torch.Tensor, alpha: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """SNAC's snake, ``x + sin(alpha x)^2 / (alpha + 1e-9)``, in four passes
    over ``x`` instead of five (in place after the first)."""
    t = torch.sin_(alpha * x)
    return torch.addcmul(x, inv, t.square_())


class _Layer:
    """A streamed layer: ``rate`` output samples per latent frame, output
    ``delay`` samples behind the latent pushed; ``slots`` index the batch
    state (one tensor per slot, ``[rows, channels, length]``)."""

    rate: int
    delay: int

    def run(self, x: torch.Tensor, state: list[torch.Tensor], call: _Call) -> torch.Tensor:
        raise NotImplementedError


class _Snake(_Layer):
    def __init__(self, module: SnacModule, rate: int, delay: int, device: torch.device) -> None:
        alpha = module.alpha.detach().to(device)
        self.alpha, self.inv = alpha, (alpha + 1e-9).reciprocal()
        self.rate, self.delay = rate, delay

    def run(self, x: torch.Tensor, state: list[torch.Tensor], call: _Call) -> torch.Tensor:
        return _snake(x, self.alpha, self.inv)


class _Conv(_Layer):
    """A 'same'-padded stride-1 convolution: state is the input's last ``span``
    samples (zeros before the start); the output is ``span / 2`` behind."""

    def __init__(
        self,
        conv: nn.Conv1d,
        slots: list[tuple[int, int]],
        rate: int,
        delay: int,
        device: torch.device,
    ) -> None:
        if conv.stride[0] != 1:
            raise UnsupportedSnacError("streamed convolutions need stride 1")
        self.weight = conv.weight.detach().to(device)
        self.bias = conv.bias.detach().to(device) if conv.bias is not None else None
        self.dilation, self.groups = conv.dilation[0], conv.groups
        self.span = self.dilation * (conv.kernel_size[0] - 1)
        pointwise = conv.kernel_size[0] == 1 and conv.groups == 1
        self.pointwise = self.weight[:, :, 0].contiguous() if pointwise else None
        padding = conv.padding[0]
        if not isinstance(padding, int) or 2 * padding != self.span:
            raise UnsupportedSnacError("streamed convolutions must be 'same'-padded")
        self.rate, self.delay = rate, delay + padding
        self.slot = len(slots)
        if self.span:
            slots.append((conv.in_channels, self.span))

    def run(self, x: torch.Tensor, state: list[torch.Tensor], call: _Call) -> torch.Tensor:
        if self.span:
            x = torch.cat((state[self.slot], x), dim=2)
            state[self.slot].copy_(x[:, :, -self.span :])  # in place: graph-capturable
        if self.pointwise is not None:
            out = _pointwise(x, self.pointwise, self.bias)
        else:
            out = _conv1d(x, self.weight, self.bias, self.dilation, self.groups)
        if self.bias is None and not self.span:
            return out  # zeros stay zeros
        return call.mask(out, self.rate, self.delay)


class _Up(_Layer):
    """A transposed convolution (stride s, kernel 2s, padding p), polyphase:
    output block ``n`` (s samples) depends on inputs ``n - 1`` and ``n``, so
    it is one matrix ``[s x out, 2 x in]`` times the stacked pair of input
    columns (a GEMM: the first block's 8.4M-weight layer is memory-bound at
    a few new columns per step, and oneDNN's convolution re-lays its weights
    out on every call, measured 10x slower).  State: the last input column.
    Output delay: ``s x input delay + p``."""

    def __init__(
        self,
        conv: nn.ConvTranspose1d,
        slots: list[tuple[int, int]],
        rate: int,
        delay: int,
        device: torch.device,
    ) -> None:
        s = self.stride = conv.stride[0]
        padding = conv.padding[0]
        if conv.kernel_size[0] != 2 * s or conv.groups != 1 or conv.output_padding[0]:
            raise UnsupportedSnacError(
                "streamed upsampling needs kernel 2 x stride, no output padding"
            )
        if not isinstance(padding, int) or conv.dilation[0] != 1:
            raise UnsupportedSnacError("transposed convolution padding must be an int")
        weight = conv.weight.detach().to(device)  # [in, out, 2s]
        # row r * out + o: output o at phase r; columns: input n - 1, then input n
        previous = weight[:, :, s:].permute(2, 1, 0)  # [s, out, in]
        current = weight[:, :, :s].permute(2, 1, 0)
        self.weight = torch.cat((previous, current), dim=2).reshape(-1, 2 * weight.shape[0])
        bias = conv.bias.detach().to(device) if conv.bias is not None else None
        self.bias = bias.repeat(s) if bias is not None else None
        self.out_channels = conv.out_channels
        self.rate, self.delay = rate * s, delay * s + padding
        self.slot = len(slots)
        slots.append((conv.in_channels, 1))

    def run(self, x: torch.Tensor, state: list[torch.Tensor], call: _Call) -> torch.Tensor:
        buf = torch.cat((state[self.slot], x), dim=2)
        state[self.slot].copy_(buf[:, :, -1:])
        pairs = torch.cat((buf[:, :, :-1], buf[:, :, 1:]), dim=1)  # [B, 2 in, n]
        # time-major GEMM: [B, n, 2 in] x [2 in, s*out] (MKL's best shape here)
        rows, _, n = pairs.shape
        flat = pairs.transpose(1, 2).reshape(rows * n, -1)
        out = functional.linear(flat, self.weight, self.bias)
        out = out.view(rows, n, self.stride, self.out_channels).permute(0, 3, 1, 2)
        return call.mask(
            out.reshape(rows, self.out_channels, n * self.stride), self.rate, self.delay
        )


class _Noise(_Layer):
    """``x + noise * linear(x)``, noise keyed to (seed, block, position)."""

    def __init__(
        self, module: SnacModule, block: int, rate: int, delay: int, device: torch.device
    ) -> None:
        self.weight = module.linear.weight.detach()[:, :, 0].to(device).contiguous()
        self.block, self.rate, self.delay = block, rate, delay

    def run(self, x: torch.Tensor, state: list[torch.Tensor], call: _Call) -> torch.Tensor:
        noise = keyed_noise(
            call.noise_keys(self.block), call._positions(self.rate, self.delay, x.shape[-1])
        )
        return x + noise[:, None, :].to(x.dtype) * _pointwise(x, self.weight, None)


class _Residual(_Layer):
    """``x + branch(x)``: the branch is ``hold`` samples behind, so the
    input waits that long in the state."""

    def __init__(
        self, branch: list[_Layer], hold: int, slots: list[tuple[int, int]], channels: int
    ) -> None:
        self.branch = branch
        self.hold = hold
        self.rate, self.delay = branch[-1].rate, branch[-1].delay
        self.slot = len(slots)
        slots.append((channels, hold))

    def run(self, x: torch.Tensor, state: list[torch.Tensor], call: _Call) -> torch.Tensor:
        y = x
        for layer in self.branch:
            y = layer.run(y, state, call)
        buf = torch.cat((state[self.slot], x), dim=2)
        state[self.slot].copy_(buf[:, :, -self.hold :])
        return y + buf[:, :, : x.shape[-1]]


class _Tanh(_Layer):
    def __init__(self, rate: int, delay: int) -> None:
        self.rate, self.delay = rate, delay

    def run(self, x: torch.Tensor, state: list[torch.Tensor], call: _Call) -> torch.Tensor:
        return torch.tanh(x)


def _compile(
    decoder: SnacModule, noise: NoiseMode, device: torch.device
) -> tuple[list[_Layer], list[tuple[int, int]]]:
    """SNAC's decoder modules -> streamed layers and the state slot shapes."""
    from snac.layers import DecoderBlock, NoiseBlock, ResidualUnit, Snake1d

    slots: list[tuple[int, int]] = []
    layers: list[_Layer] = []
    rate, delay, blocks = 1, 0, 0

    def add(layer: _Layer) -> _Layer:
        nonlocal rate, delay
        rate, delay = layer.rate, layer.delay
        return layer

    def residual(unit: SnacModule) -> _Layer:
        nonlocal rate, delay
        start_rate, start_delay = rate, delay
        branch = [simple(m) for m in unit.block]
        hold = delay - start_delay
        assert rate == start_rate and hold > 0
        channels = branch[0].alpha.shape[1]  # type: ignore[attr-defined]
        return _Residual(branch, hold, slots, channels)

    def simple(module: nn.Module) -> _Layer:
        if isinstance(module, Snake1d):
            return add(_Snake(module, rate, delay, device))
        if isinstance(module, nn.Conv1d):
            return add(_Conv(module, slots, rate, delay, device))
        raise UnsupportedSnacError(f"cannot stream {type(module).__name__}")

    for module in decoder.model:
        if isinstance(module, DecoderBlock):
            for sub in module.block:
                if isinstance(sub, nn.ConvTranspose1d):
                    layers.append(add(_Up(sub, slots, rate, delay, device)))
                elif isinstance(sub, NoiseBlock):
                    if noise == "keyed":
                        layers.append(_Noise(sub, blocks, rate, delay, device))
                elif isinstance(sub, ResidualUnit):
                    layers.append(residual(sub))
                else:
                    layers.append(simple(sub))
            blocks += 1
        elif isinstance(module, nn.Tanh):
            layers.append(_Tanh(rate, delay))
        else:
            layers.append(simple(module))
    return layers, slots


# --- the decoder ---------------------------------------------------------------------


class SnacStreamDecoder:
    """A loaded 24 kHz SNAC on a device, prepared for streaming: holds the
    weights, no stream state (see ``SnacBatch``, ``SnacStream``)."""

    def __init__(self, model: SnacModule, device: torch.device, noise: NoiseMode = "keyed") -> None:
        if getattr(model, "vq_strides", None) != SNAC_24KHZ_CONFIG["vq_strides"]:
            raise UnsupportedSnacError(
                "the streamed decoder needs the 24 kHz SNAC (vq strides 4, 2, 1)"
            )
        if getattr(model, "attn_window_size", None) is not None:
            raise UnsupportedSnacError("SNAC models with attention are not streamed")
        self.device = device
        self.noise: NoiseMode = noise
        self.hop_length = int(model.hop_length)
        with torch.no_grad():
            quantizers = list(model.quantizer.quantizers)
            self.codebooks = [q.codebook.weight.detach().to(device) for q in quantizers]
            self.proj_w = [q.out_proj.weight.detach()[:, :, 0].to(device) for q in quantizers]
            self.proj_b = [q.out_proj.bias.detach().to(device) for q in quantizers]
            self.layers, self.slots = _compile(model.decoder, noise, device)
            self.level_index = [
                torch.tensor(positions, dtype=torch.int64, device=device)
                for positions in _LEVEL_POSITIONS
            ]
        self.latent_dim = int(self.proj_w[0].shape[0])
        self.samples_per_frame = LATENT_PER_FRAME * self.hop_length
        #: samples by which the streamed output trails the codes pushed
        self.lookahead_samples = self.layers[-1].delay
        #: latent frames of zeros ``finish`` pushes to flush the look-ahead
        self.flush_latent = -(-self.lookahead_samples // self.hop_length)

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[rows, frames, 7]`` (int64) -> latent ``[rows, 768, 4 x frames]``."""
        rows, frames, _ = codes.shape
        z: torch.Tensor | None = None
        for level, positions in enumerate(_LEVEL_POSITIONS):
            picked = codes.index_select(2, self.level_index[level])
            picked = picked.reshape(rows, frames * len(positions))
            emb = functional.embedding(picked, self.codebooks[level])
            part = functional.linear(emb, self.proj_w[level], self.proj_b[level])
            part = part.repeat_interleave(LATENT_PER_FRAME // len(positions), dim=1)
            z = part if z is None else z + part
        assert z is not None
        return z.transpose(1, 2)

    def initial_state(self, rows: int) -> list[torch.Tensor]:
        return [torch.zeros((rows, c, n), device=self.device) for c, n in self.slots]

    def run(self, latent: torch.Tensor, state: list[torch.Tensor], call: _Call) -> torch.Tensor:
        """Push ``latent`` [rows, 768, frames] through the carried ``state``;
        the output samples [rows, frames x 512] (stream indices)."""
        x = call.mask(latent, 1, 0)
        for layer in self.layers:
            x = layer.run(x, state, call)
        return x[:, 0, :]


@dataclass
class _Row:
    seed: int
    index: int  #: the row in the stacked state
    pushed: int = 0  #: latent frames pushed
    end: int | None = None  #: latent frames of the utterance, once finished


class SnacBatch:
    """The carried decode state of several streams, stacked on the batch
    dimension.  Streams ``join`` and ``leave`` at any time; ``step`` decodes
    the new frames of any subset of them in one batch per frame count;
    ``finish`` flushes streams that ended and removes them."""

    def __init__(self, decoder: SnacStreamDecoder) -> None:
        self.decoder = decoder
        self.keys: list[Any] = []
        self.rows: dict[Any, _Row] = {}
        self.state = decoder.initial_state(0)

    def __len__(self) -> int:
        return len(self.keys)

    def join(self, key: Any, seed: int = 0) -> None:
        self.join_many([(key, seed)])

    def join_many(self, streams: Sequence[tuple[Any, int]]) -> None:
        """Add streams (key, noise seed) with fresh state, in one copy."""
        for key, _ in streams:
            if key in self.rows:
                raise ValueError(f"stream {key!r} is already in the batch")
        if len({key for key, _ in streams}) != len(streams):
            raise ValueError("a stream key is listed twice")
        fresh = self.decoder.initial_state(len(streams))
        self.state = [torch.cat((s, f)) for s, f in zip(self.state, fresh, strict=True)]
        for key, seed in streams:
            self.rows[key] = _Row(seed, index=len(self.keys))
            self.keys.append(key)

    def leave_many(self, keys: Sequence[Any]) -> None:
        """Drop streams and their state, in one copy."""
        self._check_members(keys)
        self._remove(keys)

    def _remove(self, keys: Sequence[Any]) -> None:
        gone = {self.rows[key].index for key in keys}
        kept = [i for i in range(len(self.keys)) if i not in gone]
        index = torch.tensor(kept, dtype=torch.int64, device=self.decoder.device)
        self.state = [s.index_select(0, index) for s in self.state]
        for key in keys:
            del self.rows[key]
        self.keys = [self.keys[i] for i in kept]
        for i, key in enumerate(self.keys):
            self.rows[key].index = i

    def _check_members(self, keys: Sequence[Any]) -> None:
        """Every key once and in the batch, checked before anything changes:
        a wrong list must not leave the batch's rows and state out of step
        (every stream in it would fail)."""
        if len(set(keys)) != len(keys):
            raise ValueError("a stream key is listed twice")
        missing = [key for key in keys if key not in self.rows]
        if missing:
            raise KeyError(f"stream {missing[0]!r} has not joined")

    def step(self, frames: Mapping[Any, Sequence[Frame]]) -> dict[Any, np.ndarray]:
        """Decode each listed stream's new frames; returns each stream's new
        final samples (float32; none until the look-ahead has filled)."""
        self._check_members(list(frames))
        groups: dict[int, list[Any]] = {}
        for key, new in frames.items():
            groups.setdefault(len(new), []).append(key)
        out: dict[Any, np.ndarray] = {}
        with torch.inference_mode():
            for count, keys in groups.items():
                if count == 0:
                    out.update({k: np.zeros(0, np.float32) for k in keys})
                    continue
                codes = torch.tensor([list(map(list, frames[k])) for k in keys], dtype=torch.int64)
                if codes.shape[2] != 7 or int(codes.min()) < 0 or int(codes.max()) >= 4096:
                    raise ValueError("a frame is 7 codes in 0..4095 (see codes.CodeMapper)")
                latent = self.decoder.latent(codes.to(self.decoder.device))
                out.update(self._push(keys, latent))
        return out

    def finish(self, keys: Sequence[Any]) -> dict[Any, np.ndarray]:
        """End these streams' utterances: their remaining samples; they leave."""
        self._check_members(keys)
        for key in keys:
            row = self.rows[key]
            row.end = row.pushed
        with torch.inference_mode():
            zeros = torch.zeros(
                (len(keys), self.decoder.latent_dim, self.decoder.flush_latent),
                device=self.decoder.device,
            )
            out = self._push(list(keys), zeros) if keys else {}
        self._remove(keys)  # (checked above)
        return out

    def _push(self, keys: list[Any], latent: torch.Tensor) -> dict[Any, np.ndarray]:
        decoder = self.decoder
        rows = [self.rows[k] for k in keys]
        index = [row.index for row in rows]
        whole = len(index) == len(self.keys) and index == list(range(len(index)))
        if whole:
            state = self.state
        else:
            picked = torch.tensor(index, dtype=torch.int64, device=decoder.device)
            state = [s.index_select(0, picked) for s in self.state]
        frames = latent.shape[2]
        call = _Call([r.pushed for r in rows], [r.end for r in rows], frames, decoder.device)
        call.seeds = [r.seed for r in rows]
        audio = decoder.run(latent, state, call).float().cpu().numpy()
        if not whole:
            for full, part in zip(self.state, state, strict=True):
                full.index_copy_(0, picked, part)
        hop, lag = decoder.hop_length, decoder.lookahead_samples
        out: dict[Any, np.ndarray] = {}
        for i, (key, row) in enumerate(zip(keys, rows, strict=True)):
            first = row.pushed * hop - lag  # the offline position of this push's first sample
            lo = max(0, -first)
            hi = (
                frames * hop
                if row.end is None
                else max(lo, min(frames * hop, row.end * hop - first))
            )
            out[key] = audio[i, lo:hi]
            row.pushed += frames
        return out


class SnacStream:
    """One utterance's streamed decode: ``push`` frames, ``finish`` at the end."""

    def __init__(self, decoder: SnacStreamDecoder, seed: int = 0) -> None:
        self.batch = SnacBatch(decoder)
        self.batch.join(0, seed)

    def push(self, frames: Sequence[Frame]) -> np.ndarray:
        return self.batch.step({0: frames})[0]

    def finish(self) -> np.ndarray:
        return self.batch.finish([0])[0]


def decode_offline(
    model: SnacModule, frames: Sequence[Frame], noise: NoiseMode = "keyed", seed: int = 0
) -> np.ndarray:
    """The whole-utterance decode with SNAC's own modules (the reference the
    streamed decode equals): ``quantizer.from_codes``, then the decoder, with
    the noise blocks keyed (positions from 0) or left out."""
    from snac.layers import DecoderBlock, NoiseBlock

    levels = [
        torch.tensor([[f[p] for f in frames for p in positions]], dtype=torch.int64)
        for positions in _LEVEL_POSITIONS
    ]
    device = next(model.parameters()).device
    with torch.inference_mode():
        x = model.quantizer.from_codes([lv.to(device) for lv in levels])
        block = 0
        for module in model.decoder.model:
            if not isinstance(module, DecoderBlock):
                x = module(x)
                continue
            for sub in module.block:
                if isinstance(sub, NoiseBlock):
                    if noise == "keyed":
                        keys = torch.tensor([_noise_key(seed, block)], device=device)
                        pos = torch.arange(x.shape[-1], device=device)[None, :]
                        x = x + keyed_noise(keys, pos)[:, None, :] * sub.linear(x)
                else:
                    x = sub(x)
            block += 1
        result: np.ndarray = x[0, 0].float().cpu().numpy()
        return result
