"""The gateway's streamed HiFi-GAN vocoder on a GPU: exactness and many streams.

Two modes, so that the GPU machine needs nothing but torch:

``prepare`` (here, with the gateway's full environment: piper, onnx,
onnxruntime) loads the bundled Piper voice the way the engine does
(``LoadedVoice``: the torch generator built from the voice's ONNX decoder and
checked against it), runs the real Piper acoustic stages (phonemizer, text
encoder, flow) on a few sentences, and saves into ``--data``:

- ``model.pt``: the generator's structure (``HifiGanSpec`` as a dict) and its
  state dict;
- ``latents.pt``: the decoder-input latents ``[channels, frames]`` of the
  sentences, the chunk schedule and the chunk plans;
- ``cpu_ref.pt``: per latent, the CPU streamed decode (``DecoderStream``
  pushed chunk by chunk as ``ChunkDecoder`` does, then flushed) and the CPU
  whole-utterance decode.

``run`` (the GPU machine: torch and ``gateway/vocoders/*.py`` only) prints
and appends JSON lines to ``--out`` as it goes:

- ``exactness``: per latent, the SNR (dB) of the CUDA streamed decode against
  the CPU streamed decode, against the CUDA whole decode, and the CUDA whole
  against the CPU whole, with cuDNN's TF32 as torch defaults it (what the
  gateway runs) and with TF32 off;
- ``first_chunk``: the decode time of a new stream's first chunk (the
  schedule's first size plus the decoder's lookahead), cold and warm;
- ``streams``: N independent streams (doubling), each pushing one steady
  chunk per tick, interleaved on one CUDA stream; per-tick p50/p95 wall time
  and whether a tick stays within the audio it produces (real time);
- ``batched_window``: the whole-model forward of N chunk windows stacked in
  one batch (chunk plus lookahead on each side), as a reference for what
  stacking could buy; this is NOT the streamed path.

Streams are not stacked here: the batched carried-state step
(``stateful.push_batch``) came later and is measured on the CPU by
``bench/vocoder_batch.py``; see docs/engine.md.

    python bench/vocoder_cuda.py prepare --data artifacts/device
    PYTHONPATH=. python3 bench/vocoder_cuda.py run --data artifacts/device --out results.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

try:
    import numpy  # noqa: F401  (the vocoder modules import it; run mode never calls it)
except ImportError:  # the GPU machine may lack it: run mode only needs torch
    sys.modules["numpy"] = types.ModuleType("numpy")

from gateway.vocoders.hifigan import ConvSpec, HifiGan, HifiGanSpec, ResBlockSpec
from gateway.vocoders.stateful import DecoderStream, output_lag, plan_chunks

SENTENCES = (
    "The quick brown fox jumped over the lazy dog while the curious cat watched quietly.",
    "Streaming speech should start fast, and it should never stop for a breath it did not take.",
    "On the third of May, the ship left the harbour at dawn with forty-two passengers aboard.",
)
SCHEDULE = (16, 32, 64)  # the default piper.chunk_schedule


def emit(out: Path | None, record: dict[str, Any]) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        with out.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


# --- prepare (here) ---------------------------------------------------------------


def streamed(model: HifiGan, latent: torch.Tensor, lookahead: int) -> torch.Tensor:
    """The streamed decode of ``latent`` [C, frames], pushed as ``ChunkDecoder``
    pushes it for the default schedule, then flushed; on the latent's device."""
    frames = latent.shape[1]
    stream = DecoderStream(model)
    pieces = []
    with torch.inference_mode():
        for window in plan_chunks(frames, SCHEDULE, lookahead):
            if window.win_end > stream.pushed:
                pieces.append(stream.push(latent[:, stream.pushed : window.win_end].t()))
        pieces.append(stream.flush())
        return torch.cat(pieces)


def prepare(data: Path) -> None:
    import tempfile

    from gateway.engines.piper.acoustic import onnx_providers
    from gateway.engines.piper.engine import bundled_voice
    from gateway.engines.piper.voice import LoadedVoice

    data.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as cache:
        voice = LoadedVoice(
            bundled_voice(), Path(cache), torch.device("cpu"), onnx_providers("cpu"), 2, SCHEDULE
        )
        assert voice.vocoder is not None, voice.not_streaming_reason
        model = voice.vocoder.model
        lookahead = voice.vocoder.lookahead_frames
        latents = []
        for text in SENTENCES:
            ids = voice.phonemizer.phonemes_to_ids(voice.phonemize(text))
            encoded = voice.acoustic.encode(ids, voice.scales(1.0, deterministic=True))
            latents.append(torch.from_numpy(voice.acoustic.flow_whole(encoded).copy()))
    torch.save(
        {
            "spec": dataclasses.asdict(model.spec),
            "state": model.state_dict(),
            "sample_rate": voice.sample_rate,
        },
        data / "model.pt",
    )
    torch.save(
        {"latents": latents, "texts": list(SENTENCES), "schedule": list(SCHEDULE)},
        data / "latents.pt",
    )
    with torch.inference_mode():
        refs = [
            {"streamed": streamed(model, z, lookahead), "whole": model(z[None])[0]} for z in latents
        ]
    torch.save(
        {"refs": refs, "lookahead": lookahead, "torch": str(torch.__version__)}, data / "cpu_ref.pt"
    )
    frames = [int(z.shape[1]) for z in latents]
    print(json.dumps({"prepared": str(data), "frames": frames, "lookahead": lookahead}))


# --- run (the GPU machine) --------------------------------------------------------------


def load_model(data: Path, device: torch.device) -> tuple[HifiGan, int]:
    saved = torch.load(data / "model.pt", map_location="cpu", weights_only=True)
    raw = saved["spec"]

    def conv(d: dict[str, Any]) -> ConvSpec:
        return ConvSpec(**d)

    spec = HifiGanSpec(
        latent_channels=raw["latent_channels"],
        conv_pre=conv(raw["conv_pre"]),
        ups=tuple(conv(u) for u in raw["ups"]),
        resblocks=tuple(
            ResBlockSpec(r["kind"], tuple(conv(c) for c in r["convs"])) for r in raw["resblocks"]
        ),
        conv_post=conv(raw["conv_post"]),
        slope=raw["slope"],
        post_slope=raw["post_slope"],
    )
    model = HifiGan(spec)
    model.load_state_dict(saved["state"], strict=True)
    return model.to(device).eval(), int(saved["sample_rate"])


def snr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double().cpu(), ref.double().cpu()
    if x.shape != ref.shape:
        return float("nan")
    noise = float(((x - ref) ** 2).sum())
    signal = float((ref**2).sum())
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def exactness(out: Path, model: HifiGan, data: Path, device: torch.device, lookahead: int) -> None:
    latents = torch.load(data / "latents.pt", weights_only=True)["latents"]
    refs = torch.load(data / "cpu_ref.pt", weights_only=True)["refs"]
    for tf32 in (torch.backends.cudnn.allow_tf32, False):
        torch.backends.cudnn.allow_tf32 = tf32
        for i, (z, ref) in enumerate(zip(latents, refs, strict=True)):
            zd = z.to(device)
            with torch.inference_mode():
                s = streamed(model, zd, lookahead).cpu()
                w = model(zd[None])[0].cpu()
            emit(
                out,
                {
                    "kind": "exactness",
                    "device": device.type,
                    "cudnn_tf32": tf32,
                    "latent": i,
                    "frames": int(z.shape[1]),
                    "samples": int(s.shape[0]),
                    "snr_db_streamed_vs_cpu_streamed": round(snr_db(s, ref["streamed"]), 2),
                    "snr_db_streamed_vs_whole_same_device": round(snr_db(s, w), 2),
                    "snr_db_whole_vs_cpu_whole": round(snr_db(w, ref["whole"]), 2),
                    "max_abs_streamed_vs_cpu_streamed": float((s - ref["streamed"]).abs().max()),
                },
            )
    torch.backends.cudnn.allow_tf32 = True  # torch's default, what the gateway runs


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def first_chunk(
    out: Path, model: HifiGan, long_latent: torch.Tensor, device: torch.device, lookahead: int
) -> None:
    frames = SCHEDULE[0] + lookahead
    times = []
    for _ in range(21):
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            stream = DecoderStream(model)
            audio = stream.push(long_latent[:frames].to(device))
            audio.cpu()  # the samples are needed on the host to be sent
        times.append((time.perf_counter() - t0) * 1000)
    emit(
        out,
        {
            "kind": "first_chunk",
            "device": device.type,
            "frames_pushed": frames,
            "chunk_frames": SCHEDULE[0],
            "cold_ms": round(times[0], 2),
            "warm_p50_ms": round(statistics.median(times[1:]), 3),
            "warm_p95_ms": round(pct(times[1:], 0.95), 3),
            "note": "new DecoderStream + push + copy to host; cold = first in this process "
            "after the exactness check",
        },
    )


def streams_bench(
    out: Path,
    model: HifiGan,
    long_latent: torch.Tensor,
    device: torch.device,
    lookahead: int,
    hop: int,
    rate: int,
    counts: list[int],
    chunk: int,
    ticks: int,
    budget_s: float,
) -> None:
    """N streams, each at steady state, push ``chunk`` frames per tick."""
    total = long_latent.shape[0]
    latent = long_latent.to(device)
    audio_ms = chunk * hop / rate * 1000
    started = time.perf_counter()
    for n in counts:
        with torch.inference_mode():
            streams = [DecoderStream(model) for _ in range(n)]
            offsets = [(37 * i) % (total // 2) for i in range(n)]
            # bring each stream to steady state: first chunk and lookahead pushed
            for s, off in zip(streams, offsets, strict=True):
                s.push(latent[off : off + SCHEDULE[0] + lookahead])
            pos = [off + SCHEDULE[0] + lookahead for off in offsets]
            times: list[float] = []
            gpu_ms: list[float] = []
            for tick in range(ticks + 3):
                if any(p + chunk > total for p in pos):
                    pos = [p % (total - chunk) for p in pos]  # wrap: still real latent frames
                sync(device)
                t0 = time.perf_counter()
                ev0 = ev1 = None
                if device.type == "cuda":
                    ev0 = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                    ev1 = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                    ev0.record()
                outs = [s.push(latent[p : p + chunk]) for s, p in zip(streams, pos, strict=True)]
                if ev1 is not None:
                    ev1.record()
                host = [o.cpu() for o in outs]  # each session's samples on the host
                elapsed = (time.perf_counter() - t0) * 1000
                pos = [p + chunk for p in pos]
                if tick >= 3:  # warm-up ticks
                    times.append(elapsed)
                    if ev0 is not None and ev1 is not None:
                        gpu_ms.append(ev0.elapsed_time(ev1))
                assert all(h.shape[0] == chunk * hop for h in host)
        p50, p95 = statistics.median(times), pct(times, 0.95)
        emit(
            out,
            {
                "kind": "streams",
                "device": device.type,
                "batching": "none: N independent DecoderStreams interleaved per tick",
                "streams": n,
                "chunk_frames": chunk,
                "chunk_audio_ms": round(audio_ms, 1),
                "ticks": len(times),
                "tick_p50_ms": round(p50, 2),
                "tick_p95_ms": round(p95, 2),
                "gpu_span_p50_ms": round(statistics.median(gpu_ms), 2) if gpu_ms else None,
                "per_stream_p50_ms": round(p50 / n, 3),
                "real_time_factor_p95": round(p95 / audio_ms, 4),
                "faster_than_real_time_p95": p95 < audio_ms,
            },
        )
        if time.perf_counter() - started > budget_s or p50 > 4 * audio_ms:
            emit(out, {"kind": "note", "streams_stopped_after": n})
            break


def batched_window(
    out: Path,
    model: HifiGan,
    long_latent: torch.Tensor,
    device: torch.device,
    lookahead: int,
    hop: int,
    rate: int,
    counts: list[int],
    chunk: int,
) -> None:
    width = chunk + 2 * lookahead
    audio_ms = chunk * hop / rate * 1000
    for n in counts:
        z = torch.stack([long_latent[37 * i % 200 : 37 * i % 200 + width].t() for i in range(n)])
        z = z.to(device)
        times = []
        with torch.inference_mode():
            for rep in range(13):
                sync(device)
                t0 = time.perf_counter()
                model(z).cpu()
                if rep >= 3:
                    times.append((time.perf_counter() - t0) * 1000)
        emit(
            out,
            {
                "kind": "batched_window",
                "device": device.type,
                "note": "reference only, not the streamed path: one HifiGan.forward of N "
                "stacked windows (chunk + lookahead each side)",
                "streams": n,
                "window_frames": width,
                "chunk_audio_ms": round(audio_ms, 1),
                "p50_ms": round(statistics.median(times), 2),
                "p95_ms": round(pct(times, 0.95), 2),
            },
        )


def run(args: argparse.Namespace) -> None:
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    emit(
        out,
        {
            "kind": "machine",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "device": device.type,
            "numpy": "numpy" in sys.modules and hasattr(sys.modules["numpy"], "ndarray"),
            "commit": args.commit,
        },
    )
    model, rate = load_model(args.data, device)
    hop = model.spec.hop_length
    saved = torch.load(args.data / "latents.pt", weights_only=True)
    cpu_ref = torch.load(args.data / "cpu_ref.pt", weights_only=True)
    # the very first push on this device, before any other decode: a cold first chunk
    frames = SCHEDULE[0] + int(cpu_ref["lookahead"])
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        DecoderStream(model).push(saved["latents"][0][:, :frames].t().to(device)).cpu()
    emit(
        out,
        {
            "kind": "first_chunk_cold",
            "device": device.type,
            "frames_pushed": frames,
            "ms": round((time.perf_counter() - t0) * 1000, 2),
            "note": "first DecoderStream push in the process (model already on the device)",
        },
    )
    lookahead = -(-output_lag(model, device) // hop)
    emit(
        out,
        {
            "kind": "model",
            "hop": hop,
            "rate": rate,
            "lookahead": lookahead,
            "lookahead_cpu": cpu_ref["lookahead"],
            "cpu_ref_torch": cpu_ref["torch"],
        },
    )
    one = torch.cat([z.t() for z in saved["latents"]])  # [frames, C]: the sentences in a row
    long_latent = torch.cat([one] * args.repeat).contiguous()
    counts = [1 << i for i in range(args.max_streams.bit_length()) if 1 << i <= args.max_streams]
    sections: list[tuple[str, Any]] = [
        ("exactness", lambda: exactness(out, model, args.data, device, lookahead)),
        ("first_chunk", lambda: first_chunk(out, model, long_latent, device, lookahead)),
    ]
    for chunk in args.chunks:
        sections.append(
            (
                f"streams_{chunk}",
                lambda chunk=chunk: streams_bench(
                    out,
                    model,
                    long_latent,
                    device,
                    lookahead,
                    hop,
                    rate,
                    counts,
                    chunk,
                    args.ticks,
                    args.budget_s,
                ),
            )
        )
    sections.append(
        (
            "batched_window",
            lambda: batched_window(
                out, model, long_latent, device, lookahead, hop, rate, counts, SCHEDULE[-1]
            ),
        )
    )
    for name, section in sections:
        try:
            section()
        except Exception as exc:  # one section's failure must not lose the others
            emit(out, {"kind": "error", "section": name, "error": repr(exc)[:500]})
    emit(out, {"kind": "done"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--data", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--data", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--device", default="cuda")
    r.add_argument("--max-streams", type=int, default=128)
    r.add_argument("--chunks", type=int, nargs="+", default=[64, 16])
    r.add_argument("--ticks", type=int, default=30)
    r.add_argument("--repeat", type=int, default=8, help="copies of the sentences to stream")
    r.add_argument("--budget-s", type=float, default=40.0, help="per chunk size")
    r.add_argument("--commit", default="")
    args = parser.parse_args()
    if args.mode == "prepare":
        prepare(args.data)
    else:
        run(args)


if __name__ == "__main__":
    main()
