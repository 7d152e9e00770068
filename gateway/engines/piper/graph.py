"""Reading a Piper (VITS) voice graph: split points, sub-models, decoder structure.

What this module is for: at load time, split a voice's ONNX file into
(a) text encoder + duration predictor up to the flow's input, with the phoneme
durations as an extra output, (b) the flow, (c) the HiFi-GAN decoder; cache the
three under ``<data_dir>/models/<sha256 of the voice>`` (re-extracted when a
part's hash does not match what was recorded); and read the decoder's
structure from node attributes and initializer shapes so the torch vocoder can
be built for it.

What it must not do: run inference, or guess.  A decoder whose structure is not
recognised exactly raises ``UnsupportedDecoderError`` and the engine serves
that voice with whole-segment ONNX decode instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from gateway.vocoders.hifigan import ConvSpec, HifiGanSpec, ResBlockSpec

log = logging.getLogger(__name__)

#: bump when the split or the cache layout changes
CACHE_VERSION = 2

_PARTS = ("encoder", "flow", "decoder")
_DECODER_OPS = {"Conv", "ConvTranspose", "LeakyRelu", "Add", "Div", "Tanh", "Unsqueeze"}
_RESBLOCK_CONV = re.compile(r"/dec/resblocks\.(\d+)/convs([12]?)\.(\d+)/Conv$")


class GraphError(ValueError):
    """The graph is not a VITS voice this reader can split."""


class UnsupportedDecoderError(ValueError):
    """The decoder is not one the torch HiFi-GAN port can reproduce."""


@dataclass(frozen=True)
class SplitPoints:
    """Tensor names where the voice graph is cut."""

    flow_input: str  #: z_p, [1, C, frames]
    mask: str  #: y_mask, [1, 1, frames]
    durations: str  #: frames per phoneme id (w_ceil), [1, 1, ids]
    latent: str  #: decoder input (flow output times mask), [1, C, frames]
    #: other tensors the flow or decoder read (e.g. a speaker embedding)
    flow_extra: tuple[str, ...] = ()
    decoder_extra: tuple[str, ...] = ()
    #: the duration predictor's noise (``RandomNormalLike``, [1, 2, ids]),
    #: made an encoder input so a seeded generator can fill it; None: the
    #: graph's noise is not one this reader recognises (no seed for it)
    duration_noise: str | None = None
    #: what the latent noise is multiplied by (the prior's standard
    #: deviation, [1, C, frames]), an extra encoder output: z_p is
    #: ``mean + noise * std * noise_scale`` and the noise is added outside
    latent_std: str | None = None

    @property
    def seedable(self) -> bool:
        """The voice's sampling noise comes from the caller (``AcousticModel.encode``)."""
        return self.duration_noise is not None and self.latent_std is not None


@dataclass(frozen=True)
class VoiceParts:
    """The three sub-models of a voice, on disk."""

    source: Path
    sha256: str
    points: SplitPoints
    encoder: Path
    flow: Path
    decoder: Path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output}


def _external_inputs(
    graph: onnx.GraphProto, nodes: list[onnx.NodeProto], exclude: set[str]
) -> list[str]:
    """Tensors the given nodes read that come from outside them and are not
    initializers, constants or graph-level constants."""
    inits = {i.name for i in graph.initializer}
    producers = _producers(graph)
    own = {out for node in nodes for out in node.output}
    found: list[str] = []
    for node in nodes:
        for name in node.input:
            if not name or name in own or name in inits or name in exclude or name in found:
                continue
            producer = producers.get(name)
            if producer is not None and producer.op_type == "Constant":
                continue
            found.append(name)
    return found


def _between(graph: onnx.GraphProto, source: str, target: str | None) -> list[onnx.NodeProto]:
    """Nodes that depend on ``source`` and (if given) that ``target`` depends on,
    in graph order."""
    reached = {source}
    forward: list[onnx.NodeProto] = []
    for node in graph.node:  # ONNX graphs are topologically sorted
        if any(name in reached for name in node.input):
            forward.append(node)
            reached.update(node.output)
    if target is None:
        return forward
    needed = {target}
    backward: list[onnx.NodeProto] = []
    for node in reversed(forward):
        if any(out in needed for out in node.output):
            backward.append(node)
            needed.update(node.input)
    return backward[::-1]


def find_split_points(model: onnx.ModelProto) -> SplitPoints:
    graph = model.graph
    producers = _producers(graph)
    conv_pre = [n for n in graph.node if n.op_type == "Conv" and n.name.startswith("/dec/conv_pre")]
    if len(conv_pre) != 1:
        raise GraphError("no single /dec/conv_pre convolution: not a VITS graph")
    latent = conv_pre[0].input[0]
    ceils = [n for n in graph.node if n.op_type == "Ceil"]
    if len(ceils) != 1:
        raise GraphError("no single Ceil node: durations not found")
    durations = ceils[0].output[0]
    first_flow = next((n for n in graph.node if n.name.startswith("/flow/")), None)
    latent_node = producers.get(latent)
    if first_flow is None or latent_node is None or latent_node.op_type != "Mul":
        raise GraphError("the decoder input is not flow output times mask")
    constants = {i.name for i in graph.initializer} | {
        out for n in graph.node if n.op_type == "Constant" for out in n.output
    }
    z_candidates = [name for name in first_flow.input if name and name not in constants]
    if len(z_candidates) != 1:
        raise GraphError("cannot find the flow input")
    flow_input = z_candidates[0]
    flow_nodes = _between(graph, flow_input, latent)
    flow_outputs = {out for node in flow_nodes for out in node.output}
    masks = [name for name in latent_node.input if name not in flow_outputs]
    if len(masks) != 1:
        raise GraphError("cannot tell the mask from the flow output")
    mask = masks[0]
    flow_inputs = _external_inputs(graph, flow_nodes, {mask, flow_input})
    flow_extra = tuple(flow_inputs)
    dec_nodes = _between(graph, latent, None)
    decoder_extra = tuple(_external_inputs(graph, dec_nodes, {latent}))
    duration_noise, latent_std = _noise_points(graph, flow_input)
    return SplitPoints(
        flow_input, mask, durations, latent, flow_extra, decoder_extra, duration_noise, latent_std
    )


def _noise_points(graph: onnx.GraphProto, flow_input: str) -> tuple[str | None, str | None]:
    """VITS's two noises: the duration predictor's (``/dp/``) and the
    latent's, whose path to the flow input must be exactly
    ``Add(mean, Mul(Mul(noise, std), noise_scale))``; (None, None) otherwise."""
    randoms = [n for n in graph.node if n.op_type == "RandomNormalLike"]
    dp = [n for n in randoms if n.name.startswith("/dp/")]
    other = [n for n in randoms if not n.name.startswith("/dp/")]
    if len(dp) != 1 or len(other) != 1:
        return None, None
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def only_consumer(name: str, op: str) -> onnx.NodeProto | None:
        found = consumers.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type == op else None

    noise = other[0].output[0]
    times_std = only_consumer(noise, "Mul")
    scaled = only_consumer(times_std.output[0], "Mul") if times_std is not None else None
    added = only_consumer(scaled.output[0], "Add") if scaled is not None else None
    if times_std is None or added is None or added.output[0] != flow_input:
        return None, None
    std = [name for name in times_std.input if name != noise]
    if len(std) != 1:
        return None, None
    return dp[0].output[0], std[0]


def _extract(source: Path, target: Path, inputs: list[str], outputs: list[str]) -> None:
    onnx.utils.extract_model(str(source), str(target), inputs, outputs, check_model=False)


def split_voice(model_path: Path, cache_root: Path) -> VoiceParts:
    """Return the cached sub-models of a voice, extracting them if missing or stale."""
    sha = file_sha256(model_path)
    folder = cache_root / sha
    meta_path = folder / "meta.json"
    paths = {part: folder / f"{part}.onnx" for part in _PARTS}
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if (
                meta.get("version") == CACHE_VERSION
                and meta.get("source_sha256") == sha
                and all(file_sha256(paths[p]) == meta["parts"][p] for p in _PARTS)
            ):
                return VoiceParts(
                    model_path,
                    sha,
                    _points_from_json(meta["points"]),
                    paths["encoder"],
                    paths["flow"],
                    paths["decoder"],
                )
        except (OSError, ValueError, KeyError, TypeError):
            pass
        log.warning("model cache for %s is stale or damaged; re-extracting", model_path.name)
    folder.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(model_path), load_external_data=False)
    points = find_split_points(model)
    graph_inputs = [i.name for i in model.graph.input]
    del model
    extra = list(dict.fromkeys(points.flow_extra + points.decoder_extra))
    noise_in = [points.duration_noise] if points.seedable and points.duration_noise else []
    std_out = [points.latent_std] if points.seedable and points.latent_std else []
    _extract(
        model_path,
        paths["encoder"],
        [*graph_inputs, *noise_in],
        [points.flow_input, points.mask, points.durations, *extra, *std_out],
    )
    _extract(
        model_path,
        paths["flow"],
        [points.flow_input, points.mask, *points.flow_extra],
        [points.latent],
    )
    output_name = _graph_output(model_path)
    _extract(model_path, paths["decoder"], [points.latent, *points.decoder_extra], [output_name])
    meta = {
        "version": CACHE_VERSION,
        "source": str(model_path),
        "source_sha256": sha,
        "points": asdict(points),
        "parts": {p: file_sha256(paths[p]) for p in _PARTS},
    }
    meta_path.write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return VoiceParts(model_path, sha, points, paths["encoder"], paths["flow"], paths["decoder"])


def _graph_output(model_path: Path) -> str:
    model = onnx.load(str(model_path), load_external_data=False)
    return str(model.graph.output[0].name)


def _points_from_json(data: dict[str, Any]) -> SplitPoints:
    return SplitPoints(
        flow_input=data["flow_input"],
        mask=data["mask"],
        durations=data["durations"],
        latent=data["latent"],
        flow_extra=tuple(data.get("flow_extra", ())),
        decoder_extra=tuple(data.get("decoder_extra", ())),
        duration_noise=data.get("duration_noise"),
        latent_std=data.get("latent_std"),
    )


# --- decoder structure -----------------------------------------------------------


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _conv_spec(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> ConvSpec:
    attrs = _attrs(node)
    weight = node.input[1]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if weight not in shapes or (bias is not None and bias not in shapes):
        raise UnsupportedDecoderError(f"{node.name}: weights are not initializers")
    shape = shapes[weight]
    if len(shape) != 3 or attrs.get("group", 1) != 1:
        raise UnsupportedDecoderError(f"{node.name}: not a plain 1-d convolution")
    pads = list(attrs.get("pads", [0, 0]))
    if len(pads) != 2 or pads[0] != pads[1]:
        raise UnsupportedDecoderError(f"{node.name}: asymmetric padding")
    kernel = list(attrs.get("kernel_shape", [shape[2]]))
    dilation = int(attrs.get("dilations", [1])[0])
    stride = int(attrs.get("strides", [1])[0])
    transposed = node.op_type == "ConvTranspose"
    if transposed:
        if list(attrs.get("output_padding", [0])) != [0] or dilation != 1:
            raise UnsupportedDecoderError(f"{node.name}: output padding or dilation")
        in_ch, out_ch = shape[0], shape[1]
    else:
        if stride != 1:
            raise UnsupportedDecoderError(f"{node.name}: strided convolution")
        out_ch, in_ch = shape[0], shape[1]
    if kernel != [shape[2]]:
        raise UnsupportedDecoderError(f"{node.name}: kernel_shape {kernel} != weight {shape}")
    if bias is not None and shapes[bias] != (out_ch,):
        raise UnsupportedDecoderError(f"{node.name}: bias shape {shapes[bias]}")
    return ConvSpec(weight, bias, in_ch, out_ch, shape[2], dilation, pads[0], stride)


def infer_hifigan(model: onnx.ModelProto) -> HifiGanSpec:
    """Read the HiFi-GAN structure of a decoder sub-model (or a whole voice)."""
    graph = model.graph
    shapes = {i.name: tuple(int(d) for d in i.dims) for i in graph.initializer}
    values = {i.name: i for i in graph.initializer}
    nodes = [n for n in graph.node if n.name.startswith("/dec/")]
    unknown = {n.op_type for n in nodes} - _DECODER_OPS
    if unknown:
        raise UnsupportedDecoderError(f"decoder ops not supported: {sorted(unknown)}")
    convs = [n for n in nodes if n.op_type == "Conv"]
    pre = [n for n in convs if n.name.startswith("/dec/conv_pre/")]
    post = [n for n in convs if n.name.startswith("/dec/conv_post/")]
    if len(pre) != 1 or len(post) != 1:
        raise UnsupportedDecoderError("conv_pre/conv_post not found")
    if any(n.name.startswith("/dec/cond") for n in nodes):
        raise UnsupportedDecoderError("speaker-conditioned decoder")
    ups = [_conv_spec(n, shapes) for n in nodes if n.op_type == "ConvTranspose"]
    blocks: dict[int, list[tuple[int, int, ConvSpec]]] = {}
    kinds: dict[int, int] = {}
    for node in convs:
        match = _RESBLOCK_CONV.search(node.name)
        if match is None:
            continue
        index, group, step = int(match[1]), match[2], int(match[3])
        kinds[index] = 2 if group == "" else 1
        order = (step, int(group or 1))
        blocks.setdefault(index, []).append((*order, _conv_spec(node, shapes)))
    if len(convs) != 2 + sum(len(b) for b in blocks.values()):
        raise UnsupportedDecoderError("convolutions outside conv_pre/resblocks/conv_post")
    if sorted(blocks) != list(range(len(blocks))):
        raise UnsupportedDecoderError("resblock numbering has gaps")
    resblocks = tuple(
        ResBlockSpec(kinds[i], tuple(c for _, _, c in sorted(blocks[i], key=lambda t: t[:2])))
        for i in range(len(blocks))
    )
    for block in resblocks:
        if block.kind == 1 and len(block.convs) % 2:
            raise UnsupportedDecoderError("resblock type 1 with an odd number of convolutions")
    if not ups or len(resblocks) % len(ups):
        raise UnsupportedDecoderError("resblocks do not divide among the upsampling stages")
    num_kernels = len(resblocks) // len(ups)
    divs = [n for n in nodes if n.op_type == "Div"]
    for div in divs:
        divisor = values.get(div.input[1])
        if divisor is None or not np.allclose(numpy_helper.to_array(divisor), num_kernels):
            raise UnsupportedDecoderError("stage outputs are not the mean of the resblocks")
    if len(divs) != len(ups) and num_kernels > 1:
        raise UnsupportedDecoderError("one mean per upsampling stage expected")
    slopes = [float(_attrs(n)["alpha"]) for n in nodes if n.op_type == "LeakyRelu"]
    if len(slopes) < 2:
        raise UnsupportedDecoderError("leaky ReLU activations not found")
    pre_spec = _conv_spec(pre[0], shapes)
    post_spec = _conv_spec(post[0], shapes)
    return HifiGanSpec(
        latent_channels=pre_spec.in_channels,
        conv_pre=pre_spec,
        ups=tuple(ups),
        resblocks=resblocks,
        conv_post=post_spec,
        slope=slopes[0],
        post_slope=slopes[-1],
    )


def decoder_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
