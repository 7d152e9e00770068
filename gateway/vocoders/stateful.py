"""HiFi-GAN decode with carried state: every layer keeps the tail of its input.

What this module is for: decoding a latent that arrives piece by piece without
recomputing any context.  Each convolution keeps the last ``dilation *
(kernel - 1)`` samples of its input between calls, each transposed
convolution its last input column, each residual step the inputs its branch
has not caught up with.  Pushing latent frames returns every output sample
that those frames determine; ``finish`` pushes the utterance's last frames and
returns the rest (the right-hand zero padding of the whole-utterance decode)
in the same pass, each layer's padding appended to its input.  The
concatenated output equals ``HifiGan.forward`` on the whole latent up to float
rounding, and the total work equals one whole-utterance decode.  (The
stateless windowed scheme this replaced, gone from the code, decoded each
chunk with 10 frames of context on each side: 1.6x the work at 32-frame
chunks, 2.1x at 16.)

The output lags the input by ``lag`` samples (the decoder's right-hand
receptive field, about 11 latent frames for Piper's medium voices), so a chunk
``[start, end)`` of frames needs the latent up to ``end + lookahead_frames``.
``ChunkDecoder.decode_chunk`` hides that: it pushes what is missing and
returns exactly the samples of ``[start, end)``, holding any extra for the
next chunk.

Activations are time-major (``[batch, samples, channels]``; a stream's own
state has a batch of 1) and convolutions run unpadded on the carried tail
plus the new input, in oneDNN on the CPU (see ``_conv``).  A sum of one
matrix product per kernel tap was tried and measured no faster on the 2-core
CPU.

Batched steps (``push_batch``): after an utterance's first push every layer's
lag is fixed, so every stream of a model carries state of the same shapes
(``DecoderStream.batch_key``) and streams pushing the same number of frames
can run one step together: their state tensors are stacked on the batch
dimension, the layers run once, and each stream takes its row of the new
state back.  The result is bit-identical to pushing each stream alone
(tested); what it saves on the CPU is measured in ``bench/vocoder_batch.py``
(docs/engine.md).  The decode worker does not use it: wired in and measured
in round 9, it bought no capacity on the 2-core CPU (docs/engine.md).

Bounded shapes: oneDNN compiles (JIT) one primitive per convolution shape and
keeps it in a process-wide cache (1,024 entries by default, LRU).  The latent
pushed for a chunk has a size fixed by the chunk schedule, except the push
that reaches the utterance's end, whose size is the remainder (1 to the
largest chunk); pushed whole, every new remainder compiled about 80 new
primitives (about 100 ms on the 2-core CPU, a first-call cost on the hot
path) and kept them, so the cache filled with one-off shapes: +210 MiB of RSS
over 150 utterances of random lengths in one process, never returned.  That
push is therefore made in power-of-two pieces, largest first
(``final_pieces``), the last of them with the end (``finish``): the carried
state makes any split exact, the set of shapes is bounded by the schedule
and log2 of its largest chunk (each power pushed, and each finished), and
``StreamingHifiGan.warm_up`` compiles them all at start.

Why ``finish`` and not a push then a flush: a flush alone ran every layer
two to four times on a few samples of padding (a convolution's push, then
its flush; a residual block's steps in turn), about 16 ms of one core per
utterance on the 2-core CPU whatever its length, against about 7 ms for the
same samples in one pass; with the short segments LLM text makes (about a
second of audio), that was a fifth of the vocoder's work
(``docs/engine.md``, "The end of an utterance").

What it must not do: pad with zeros anywhere but the utterance edges (that is
what keeps it exact), keep state across utterances, carry a view into a
chunk's activations as state (it keeps the whole buffer alive: ``_carry``),
or be used from two threads at once (one stream per job; the decode worker
runs a job's chunks one at a time).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from gateway.vocoders.hifigan import HifiGan, UnsupportedSpecError

_MKLDNN = bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
_mkldnn_conv = torch.ops.aten.mkldnn_convolution
_packed_conv = torch.ops.mkldnn._convolution_pointwise


#: one piece of a layer's carried state: a tensor, not yet one, or a count
_State = torch.Tensor | int | None


def _tensor(value: _State) -> torch.Tensor:
    assert isinstance(value, torch.Tensor)
    return value


def _none(x: torch.Tensor) -> torch.Tensor:
    """No samples, with ``x``'s batch and channels."""
    return x[:, :0]


def _conv_weight(weight: torch.Tensor, dilation: int = 1) -> torch.Tensor:
    """[out, in, k] -> [out, in, 1, k], channels-last (what the time-major
    activations are, seen as a 4-D batch of one row), prepacked on the CPU
    (``_pack``)."""
    dense = weight.detach()[:, :, None, :].contiguous(memory_format=torch.channels_last)
    return _pack(dense, dilation) if dense.device.type == "cpu" and _MKLDNN else dense


def _pack(weight: torch.Tensor, dilation: int) -> torch.Tensor:
    """``weight`` [out, in, 1, k] reordered once into oneDNN's blocked
    layout (an opaque ``mkldnn`` tensor), so that a convolution reads it as
    it is.  Given the plain layout, oneDNN reorders the weights into a new
    buffer on every call (``ONEDNN_VERBOSE=profile_exec``: one reorder per
    convolution): the whole model's weights allocated, copied and freed for
    every pushed piece, on the decode worker, which churned and fragmented
    its heap under load (``docs/operations.md``, Memory).  Prepacked, the
    output is bit-identical and a streamed decode takes about 7-10% less
    CPU (one thread, the benchmark sentence).  For the wide layers the
    layout oneDNN wants does not depend on the input length; for the
    narrowest (32 and 64 channels, tens of KiB) it does, and there oneDNN
    still reorders on some calls (7% of the calls in a soak, against every
    call before), with the same result."""
    length = dilation * (weight.shape[3] - 1) + 1024  # a piece of a few frames, late layers
    packed: torch.Tensor = torch.ops.aten.mkldnn_reorder_conv2d_weight(
        weight.to_mkldnn(), [0, 0], [1, 1], [1, dilation], 1, [1, weight.shape[1], 1, length]
    )
    return packed


def _conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int = 1
) -> torch.Tensor:
    """An unpadded convolution of time-major ``x`` [B, T, in] -> [B, T - span, out].

    ``x`` seen as [B, in, 1, T] is a channels-last image, which oneDNN runs
    about 30% faster than the channel-major layout on the late, narrow, long
    layers (measured on the 2-core CPU), and the result comes back
    time-major too, so no layer ever transposes."""
    x4 = x.transpose(1, 2)[:, :, None, :]
    if weight.is_mkldnn:
        # prepacked (``_pack``): oneDNN reads the weights as they are
        out: torch.Tensor = _packed_conv(
            x4, weight, bias, [0, 0], [1, 1], [1, dilation], 1, "none", [], ""
        )
    elif x.device.type == "cpu" and _MKLDNN:
        # called directly: torch's own dispatch sends inputs under 20480
        # values (every flush, the early layers of a small chunk) to its slow
        # reference kernels, 3x slower here; oneDNN handles every size
        out = _mkldnn_conv(x4, weight, bias, [0, 0], [1, 1], [1, dilation], 1)
    else:
        out = functional.conv2d(x4, weight, bias, dilation=(1, dilation))
    return out[:, :, 0, :].transpose(1, 2)


def _carry(x: torch.Tensor) -> torch.Tensor:
    """``x``, a slice of a layer's activations kept for the next push, in a
    buffer of its own.  Kept as a view, it would keep the whole buffer it was
    cut from alive until then: every layer's input and output for the
    chunk, 46 MiB per stream after a 64-frame chunk against 0.23 MiB of
    actual state, held by every stream between its chunks (issue 28: the
    server's peak RSS beside neighbours reading flat out; docs/operations.md,
    Memory)."""
    return x.clone(memory_format=torch.contiguous_format)


def _fill(held: torch.Tensor, x: torch.Tensor, slope: float | None, zeros: int = 0) -> torch.Tensor:
    """``held`` then ``x`` (through a leaky ReLU when ``slope`` is given),
    then ``zeros`` zero rows (the utterance's right-hand padding: leaky ReLU
    keeps zeros zero) in one new buffer: one pass over ``x``, not two."""
    n, m = held.shape[1], x.shape[1]
    buf = x.new_empty((x.shape[0], n + m + zeros, x.shape[2]))
    buf[:, :n] = held
    if slope is None:
        buf[:, n : n + m] = x
    else:
        torch.ops.aten.leaky_relu.out(x, slope, out=buf[:, n : n + m])
    if zeros:
        buf[:, n + m :] = 0
    return buf


#: weights in the streamed layout, made once per layer (3 ms a stream otherwise)
_WEIGHTS: weakref.WeakKeyDictionary[nn.Module, tuple[torch.Tensor, torch.Tensor | None]] = (
    weakref.WeakKeyDictionary()
)


def _prepared(
    conv: nn.Conv1d | nn.ConvTranspose1d, scale: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A layer's weights for ``_conv``, times ``scale`` (the mean's 1/k folded
    into the layer after it: leaky ReLU commutes with a positive scale).  A
    transposed convolution becomes a kernel-2 convolution with ``stride x
    out`` channels, channel ``r * out + o`` being output ``o`` at phase ``r``
    (time-major, ``[T, stride x out]`` is then ``[T x stride, out]``).
    Cached by layer: a layer's scale is fixed by the model's structure."""
    cached = _WEIGHTS.get(conv)
    if cached is not None:
        return cached
    with torch.inference_mode(False), torch.no_grad():
        weight = conv.weight.detach() * scale
        bias = conv.bias.detach() if conv.bias is not None else None
        if isinstance(conv, nn.ConvTranspose1d):
            s = conv.stride[0]
            taps = functional.pad(weight, (0, 2 * s - conv.kernel_size[0]))  # [in, out, 2s]
            # tap 0 reads input n-1 (kernel positions r+s), tap 1 input n (positions r)
            poly = torch.stack((taps[:, :, s:], taps[:, :, :s]), dim=-1)  # [in, out, s, 2]
            weight = poly.permute(2, 1, 0, 3).reshape(-1, weight.shape[0], 2)  # [s*out, in, 2]
            bias = bias.repeat(s) if bias is not None else None
        dilation = conv.dilation[0] if isinstance(conv, nn.Conv1d) else 1
        cached = (_conv_weight(weight, dilation), bias)
    _WEIGHTS[conv] = cached
    return cached


class _Conv:
    """A 'same'-padded 1-D convolution, streamed: state is the input tail.
    With ``slope``, a leaky ReLU is applied to the input first."""

    def __init__(self, conv: nn.Conv1d, slope: float | None = None, scale: float = 1.0) -> None:
        if conv.stride[0] != 1 or conv.groups != 1:
            raise UnsupportedSpecError("streamed convolutions need stride 1 and one group")
        self.slope = slope
        self.weight, self.bias = _prepared(conv, scale)
        self.dilation = conv.dilation[0]
        self.span = self.dilation * (conv.kernel_size[0] - 1)
        padding = conv.padding[0]
        if not isinstance(padding, int) or 2 * padding != self.span:
            raise UnsupportedSpecError("streamed convolutions must be 'same'-padded")
        self.padding = padding
        self.tail = conv.weight.new_zeros((1, padding, conv.in_channels))  # left zero padding
        self.out_channels = conv.out_channels

    def push(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(_fill(self.tail, x, self.slope))

    def _run(self, buf: torch.Tensor) -> torch.Tensor:
        length = buf.shape[1] - self.span
        if length <= 0:
            self.tail = buf
            return buf.new_zeros((buf.shape[0], 0, self.out_channels))
        self.tail = _carry(buf[:, length:])
        return _conv(buf, self.weight, self.bias, self.dilation)

    def state(self) -> list[_State]:
        return [self.tail]

    def restore(self, values: Iterator[_State]) -> None:
        self.tail = _tensor(next(values))

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """``push(x)``, then the output the right-hand zero padding owes, in one call."""
        return self._run(_fill(self.tail, x, self.slope, self.padding))


class _ConvTranspose:
    """A transposed 1-D convolution (stride s, kernel K with s <= K <= 2s)
    after a leaky ReLU, streamed.  Written in polyphase form: output samples
    ``n*s .. n*s+s-1`` depend on inputs ``n-1`` and ``n`` only, so it is a
    kernel-2 convolution with ``s x out`` channels.  State: the last input
    row (after the ReLU) and the samples still to crop at the start."""

    def __init__(self, conv: nn.ConvTranspose1d, slope: float, scale: float = 1.0) -> None:
        s = self.stride = conv.stride[0]
        kernel = conv.kernel_size[0]
        padding = conv.padding[0]
        if not isinstance(padding, int):
            raise UnsupportedSpecError("transposed convolution padding must be an int")
        if not (s <= kernel <= 2 * s) or conv.groups != 1:
            raise UnsupportedSpecError("streamed upsampling needs stride <= kernel <= 2 x stride")
        if conv.output_padding[0] or conv.dilation[0] != 1:
            raise UnsupportedSpecError("streamed upsampling needs no output padding or dilation")
        self.slope = slope
        self.weight, self.bias = _prepared(conv, scale)
        self.out_channels = conv.out_channels
        self.prev = conv.weight.new_zeros((1, 1, conv.in_channels))  # input -1 is zero
        self.skip = padding  # the whole-utterance output starts `padding` samples in
        self.tail_length = kernel - padding - s  # raw samples past the last input's block

    def _run(self, x: torch.Tensor, zeros: int = 0) -> torch.Tensor:
        buf = _fill(self.prev, x, self.slope, zeros)
        self.prev = _carry(buf[:, -1:])
        out = _conv(buf, self.weight, self.bias)  # [B, T, s * out], phase-major channels
        return out.reshape(out.shape[0], out.shape[1] * self.stride, self.out_channels)

    def _crop(self, y: torch.Tensor) -> torch.Tensor:
        if self.skip:
            cut = min(self.skip, y.shape[1])
            self.skip -= cut
            y = y[:, cut:]
        return y

    def state(self) -> list[_State]:
        return [self.prev, self.skip]

    def restore(self, values: Iterator[_State]) -> None:
        self.prev = _tensor(next(values))
        skip = next(values)
        assert isinstance(skip, int)
        self.skip = skip

    def push(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 0:
            return x.new_zeros((x.shape[0], 0, self.out_channels))
        return self._crop(self._run(x))

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """``push(x)``, then the samples past the last input's block (one
        zero input row, of which ``tail_length`` samples belong to the
        utterance), in one call."""
        owed = x.shape[1] * self.stride + max(0, self.tail_length)
        return self._crop(self._run(x, zeros=1)[:, :owed])


class _ResidualStep:
    """``x + branch(x)``: the branch lags, so inputs wait for it."""

    def __init__(self, convs: list[_Conv]) -> None:
        self.convs = convs  # each with its leaky ReLU
        self.pending: torch.Tensor | None = None

    def _branch(self, x: torch.Tensor, finish: bool) -> torch.Tensor:
        for conv in self.convs:
            x = conv.finish(x) if finish else conv.push(x)
        return x

    def _add(self, x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        """``branch`` (a fresh tensor) += the inputs it lines up with."""
        if self.pending is None:
            self.pending = _none(x)
        held, n = self.pending.shape[1], branch.shape[1]
        if n <= held:
            branch += self.pending[:, :n]
            self.pending = torch.cat((self.pending[:, n:], x), dim=1)
            return branch
        branch[:, :held] += self.pending
        branch[:, held:] += x[:, : n - held]
        self.pending = _carry(x[:, n - held :])
        return branch

    def state(self) -> list[_State]:
        return [self.pending, *(v for conv in self.convs for v in conv.state())]

    def restore(self, values: Iterator[_State]) -> None:
        pending = next(values)
        assert pending is None or isinstance(pending, torch.Tensor)
        self.pending = pending
        for conv in self.convs:
            conv.restore(values)

    def push(self, x: torch.Tensor) -> torch.Tensor:
        return self._add(x, self._branch(x, finish=False))

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self._add(x, self._branch(x, finish=True))


class _ResBlock:
    def __init__(self, steps: list[_ResidualStep]) -> None:
        self.steps = steps

    def push(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            x = step.push(x)
        return x

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            x = step.finish(x)
        return x


class _Mean:
    """The sum of parallel residual blocks, whose outputs lag differently
    (the mean's 1/k is folded into the next layer's weights)."""

    def __init__(self, blocks: list[_ResBlock]) -> None:
        self.blocks = blocks
        self.pending: list[torch.Tensor | None] = [None] * len(blocks)

    def _combine(self, outs: list[torch.Tensor]) -> torch.Tensor:
        held = [p if p is not None else _none(o) for p, o in zip(self.pending, outs, strict=True)]
        n = min(h.shape[1] + o.shape[1] for h, o in zip(held, outs, strict=True))
        first = outs[0]
        acc = first.new_empty((first.shape[0], n, first.shape[2]))
        for i, (h, o) in enumerate(zip(held, outs, strict=True)):
            m = min(n, h.shape[1])
            if i == 0:
                acc[:, :m] = h[:, :m]
                acc[:, m:] = o[:, : n - m]
            else:
                acc[:, :m] += h[:, :m]
                acc[:, m:] += o[:, : n - m]
            self.pending[i] = torch.cat((h[:, m:], o), dim=1) if m == n else _carry(o[:, n - m :])
        return acc

    def state(self) -> list[_State]:
        steps = (step for block in self.blocks for step in block.steps)
        return [*self.pending, *(v for step in steps for v in step.state())]

    def restore(self, values: Iterator[_State]) -> None:
        for i in range(len(self.pending)):
            pending = next(values)
            assert pending is None or isinstance(pending, torch.Tensor)
            self.pending[i] = pending
        for block in self.blocks:
            for step in block.steps:
                step.restore(values)

    def push(self, x: torch.Tensor) -> torch.Tensor:
        return self._combine([block.push(x) for block in self.blocks])

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self._combine([block.finish(x) for block in self.blocks])


class _Stage:
    """Leaky ReLU, upsampling, mean of residual blocks."""

    def __init__(self, up: _ConvTranspose, mean: _Mean) -> None:
        self.up = up
        self.mean = mean

    def push(self, x: torch.Tensor) -> torch.Tensor:
        return self.mean.push(self.up.push(x))

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self.mean.finish(self.up.finish(x))


class DecoderStream:
    """One utterance's decode state.  ``push`` latent frames (time-major,
    ``[frames, channels]``), get samples."""

    def __init__(self, model: HifiGan) -> None:
        spec = model.spec
        self.hop_length = spec.hop_length
        self.conv_pre = _Conv(model.conv_pre)
        self.stages: list[_Stage] = []
        k = spec.num_kernels
        blocks = list(model.resblocks)
        for i, up in enumerate(model.ups):
            assert isinstance(up, nn.ConvTranspose1d)
            mean = _Mean([_resblock(b, spec.slope) for b in blocks[i * k : (i + 1) * k]])
            # every stage after the first takes the previous stage's sum of k
            self.stages.append(_Stage(_ConvTranspose(up, spec.slope, 1 / k if i else 1.0), mean))
        self.conv_post = _Conv(model.conv_post, spec.post_slope, 1 / k)
        self.pushed = 0  #: latent frames pushed
        self.flushed = False

    def push(self, latent: torch.Tensor) -> torch.Tensor:
        """``latent`` [frames, channels] -> the samples these frames determine."""
        self.pushed += latent.shape[0]
        return self._push(latent[None])[0]

    def _push(self, x: torch.Tensor) -> torch.Tensor:
        """[B, frames, channels] -> [B, samples], B the batch of the state."""
        x = self.conv_pre.push(x)
        for stage in self.stages:
            x = stage.push(x)
        return torch.tanh(self.conv_post.push(x))[:, :, 0]

    def finish(self, latent: torch.Tensor) -> torch.Tensor:
        """The utterance's last ``latent`` frames (maybe none): every sample
        still owed, through each layer once with its right-hand zero padding
        appended: the samples ``push`` then a separate flush would return, in
        one pass (the module docstring says what it saves)."""
        self.pushed += latent.shape[0]
        self.flushed = True
        x = self.conv_pre.finish(latent[None])
        for stage in self.stages:
            x = stage.finish(x)
        return torch.tanh(self.conv_post.finish(x))[0, :, 0]

    def flush(self) -> torch.Tensor:
        """End of the utterance: the samples still owed."""
        return self.finish(self.conv_pre.tail.new_zeros((0, self.conv_pre.tail.shape[2])))

    def state(self) -> list[_State]:
        """Every piece of carried state, in a fixed order (tensors ``[1, ...]``)."""
        values: list[_State] = [*self.conv_pre.state()]
        for stage in self.stages:
            values += stage.up.state()
            values += stage.mean.state()
        return values + self.conv_post.state()

    def restore(self, values: Iterator[_State]) -> None:
        self.conv_pre.restore(values)
        for stage in self.stages:
            stage.up.restore(values)
            stage.mean.restore(values)
        self.conv_post.restore(values)

    def batch_key(self) -> tuple[object, ...]:
        """Streams with equal keys can be pushed together (``push_batch``):
        the same model, every state tensor of the same shape, the same
        start-up crop.  After an utterance's first push every stream of a
        model has the same key (each layer's lag is then fixed)."""
        return (
            id(self.conv_pre.weight),
            self.flushed,
            *(v.shape[1] if isinstance(v, torch.Tensor) else v for v in self.state()),
        )


def push_batch(streams: Sequence[DecoderStream], latent: torch.Tensor) -> torch.Tensor:
    """One step of several streams with equal ``batch_key``: ``latent``
    [B, frames, channels] (row b for ``streams[b]``) -> [B, samples].

    Each stream's carried tensors are stacked on the batch dimension, the
    layers run once for all, and each stream gets its row of the new state
    back, so the result equals pushing each stream on its own (up to the
    float rounding of a batched convolution).  State stays per stream
    between steps: a stream may be pushed alone or in any other batch next."""
    if latent.shape[0] != len(streams) or not streams:
        raise ValueError("one latent row per stream")
    if len(streams) == 1:
        return streams[0].push(latent[0])[None]
    key = streams[0].batch_key()
    if any(stream.batch_key() != key for stream in streams[1:]):
        raise ValueError("streams with different state shapes cannot be batched")
    states = [stream.state() for stream in streams]
    carrier = streams[0]
    stacked = [
        torch.cat([_tensor(s[i]) for s in states]) if isinstance(v, torch.Tensor) else v
        for i, v in enumerate(states[0])
    ]
    carrier.restore(iter(stacked))
    try:
        out = carrier._push(latent)
        new = carrier.state()
    except BaseException:
        carrier.restore(iter(states[0]))
        raise
    for b, stream in enumerate(streams):
        stream.restore(iter(v[b : b + 1] if isinstance(v, torch.Tensor) else v for v in new))
        stream.pushed += latent.shape[1]
    return out


def _resblock(block: nn.Module, slope: float) -> _ResBlock:
    convs = [c for c in block.convs if isinstance(c, nn.Conv1d)]  # type: ignore[union-attr]
    kind = getattr(block, "kind", None)
    if kind == 2:
        steps = [_ResidualStep([_Conv(c, slope)]) for c in convs]
    elif kind == 1:
        steps = [
            _ResidualStep([_Conv(c1, slope), _Conv(c2, slope)])
            for c1, c2 in zip(convs[0::2], convs[1::2], strict=True)
        ]
    else:
        raise UnsupportedSpecError(f"unknown residual block kind {kind!r}")
    return _ResBlock(steps)


def output_lag(model: HifiGan, device: torch.device) -> int:
    """Samples by which the streamed output trails the latent pushed."""
    frames = 64
    with torch.inference_mode():
        stream = DecoderStream(model)
        zeros = torch.zeros((frames, model.spec.latent_channels), device=device)
        produced = stream.push(zeros).shape[0]
    return frames * model.spec.hop_length - produced


@dataclass(frozen=True)
class ChunkWindow:
    """Return the samples of latent frames ``[start, end)``; the latent up to
    ``win_end`` is needed to compute them (from ``win_start`` where a decoder
    has no carried state)."""

    start: int
    end: int
    win_start: int
    win_end: int


def plan_chunks(frames: int, schedule: Sequence[int], lookahead: int) -> list[ChunkWindow]:
    """Split ``frames`` latent frames into chunks following ``schedule`` (the
    last size repeats).  A chunk ``[start, end)`` needs the latent up to
    ``end + lookahead`` (the decoder's right-hand receptive field, cropped at
    the utterance's end); its left context is carried in the decode state."""
    windows: list[ChunkWindow] = []
    start = 0
    index = 0
    while start < frames:
        size = schedule[min(index, len(schedule) - 1)]
        end = min(frames, start + size)
        windows.append(ChunkWindow(start, end, start, min(frames, end + lookahead)))
        start = end
        index += 1
    return windows


def final_pieces(count: int) -> list[int]:
    """``count`` latent frames as powers of two, largest first (37 -> 32, 4,
    1): the sizes in which the push that reaches an utterance's end is made,
    so that its shapes come from a small set (see the module docstring)."""
    if count < 0:
        raise ValueError("count must be >= 0")
    return [1 << bit for bit in reversed(range(count.bit_length())) if count >> bit & 1]


class ChunkDecoder:
    """Frame-exact chunks of one utterance from a ``DecoderStream``:
    ``decode_chunk`` returns the samples of ``[window.start, window.end)``,
    pushing the latent up to ``window.win_end`` and flushing at the
    utterance's end.  Chunks must be asked for in order."""

    def __init__(self, model: HifiGan, device: torch.device, frames: int) -> None:
        self.stream = DecoderStream(model)
        self.device = device
        self.frames = frames
        self.hop_length = model.spec.hop_length
        self._held = torch.zeros(0, device=device)  # produced, not yet returned

    def decode_chunk(self, latent: np.ndarray, window: ChunkWindow) -> np.ndarray:
        stream = self.stream
        pieces = [self._held]
        with torch.inference_mode():
            count = window.win_end - stream.pushed
            if count > 0:
                # a size set by the schedule; or the remainder, reaching the
                # utterance's end: then in pieces, the last of them with the
                # end's padding (``DecoderStream.finish``)
                last = window.win_end >= self.frames
                sizes = final_pieces(count) if last else [count]
                for index, size in enumerate(sizes, 1):
                    start = stream.pushed
                    piece = np.ascontiguousarray(latent[:, start : start + size].T)
                    rows = torch.from_numpy(piece).to(self.device)
                    ending = last and index == len(sizes)
                    pieces.append(stream.finish(rows) if ending else stream.push(rows))
            audio = torch.cat(pieces)
            wanted = (window.end - window.start) * self.hop_length
            if audio.shape[0] < wanted and not stream.flushed:
                raise ValueError("chunk window stops short of the decoder's lookahead")
            self._held = _carry(audio[wanted:])
            result: np.ndarray = audio[:wanted].float().cpu().numpy()
            return result


class StreamingHifiGan:
    """A loaded generator on a device: whole decodes, batched decodes, and
    per-utterance ``ChunkDecoder``s."""

    def __init__(self, model: HifiGan, device: torch.device) -> None:
        self.model = model.to(device).eval()
        self.device = device
        self.hop_length = model.spec.hop_length
        self.latent_channels = model.spec.latent_channels
        #: latent frames past a chunk's end that its samples depend on
        self.lookahead_frames = -(-output_lag(self.model, device) // self.hop_length)

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """Decode a whole latent ``[channels, frames]`` to float32 samples."""
        with torch.inference_mode():
            z = torch.from_numpy(np.ascontiguousarray(latent, dtype=np.float32))
            audio = self.model(z.unsqueeze(0).to(self.device))[0]
            result: np.ndarray = audio.float().cpu().numpy()
            return result

    def decode_batch(self, latents: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Decode whole latents of equal length in one batch."""
        with torch.inference_mode():
            z = torch.from_numpy(np.stack(latents).astype(np.float32, copy=False))
            audio = self.model(z.to(self.device))
            return list(audio.float().cpu().numpy())

    def open(self, frames: int) -> ChunkDecoder:
        """The decode state of one utterance of ``frames`` latent frames."""
        return ChunkDecoder(self.model, self.device, frames)

    def plan(self, frames: int, schedule: Sequence[int]) -> list[ChunkWindow]:
        return plan_chunks(frames, schedule, self.lookahead_frames)

    def warm_up(self, schedule: Sequence[int]) -> None:
        """Stream a few utterance lengths once, so that requests meet only
        layer shapes oneDNN has already compiled (it pays about 100 ms per
        new shape and keeps it): every chunk size of ``schedule`` and every
        power-of-two piece of an utterance's last push (``final_pieces``):
        each pushed (all but the largest in one remainder of ``largest - 1``,
        after steady chunks of the largest) and each as the last piece, with the
        utterance's end (``DecoderStream.finish``: a remainder of that power
        alone).  Run it
        under each thread count the decode worker uses: primitives are
        compiled per thread count."""
        first = schedule[0] + self.lookahead_frames
        largest = 1 << (max(schedule).bit_length() - 1)
        search = range(first + 1, first + 4 * max(schedule))
        lengths = [first - 1]  # shorter than the first chunk
        powers = {1 << bit for bit in range(largest.bit_length())}
        for remainder in sorted(powers | {largest - 1} - {0}, reverse=True):
            found = [f for f in search if self._final_push(f, schedule) == remainder]
            if found:
                # the longest for the pieces pushed: it has steady chunks before them
                lengths.append(found[-1] if remainder == largest - 1 else found[0])
        for frames in lengths:
            latent = np.zeros((self.latent_channels, frames), dtype=np.float32)
            decoder = self.open(frames)
            for window in self.plan(frames, schedule):
                decoder.decode_chunk(latent, window)

    def _final_push(self, frames: int, schedule: Sequence[int]) -> int:
        """Latent frames in the push that reaches the end of ``frames``."""
        ends = [0, *(w.win_end for w in self.plan(frames, schedule))]
        return next(b - a for a, b in itertools.pairwise(ends) if b >= frames)
