"""Markup is not spoken: the audio of each Markdown reply against the audio
of its hand-written spoken form, same voice, same run (issue 21's target:
at most 1.15x each).

    .venv/bin/python bench/text_markup_ratio.py [--limit N] [--url http://...]

Starts ``python -m gateway serve`` on a free loopback port with Piper
deterministic (``GATEWAY_PIPER_DETERMINISTIC=true``), unless ``--url`` names
a running server.  For each reply of ``bench/text_corpus/markdown.jsonl`` it
asks ``POST /v1/audio/speech`` (``pcm``, SSE, whose ``speech.audio.done``
gives ``audio_ms``) for the reply as the client sends it (the defaults:
``input_format: "markdown"``, ``normalize: true``) and for its spoken form
read as written (``input_format: "plain"``, ``normalize: false``).  Prints one
JSON line per reply and a summary line (worst ratio, replies over target).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from gateway.bench.provenance import source_revision
from gateway.bench.runner import free_port, gateway_command, machine_info, started

ROOT = Path(__file__).resolve().parent
CORPUS = ROOT / "text_corpus" / "markdown.jsonl"
TARGET = 1.15
#: the spoken form, read as written: the gateway's input before the front-end
AS_WRITTEN = {"input_format": "plain", "normalize": False}


def load(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


@contextmanager
def gateway(url: str | None) -> Iterator[str]:
    """A gateway's HTTP base URL: ``url``, or one started here."""
    if url:
        yield url.rstrip("/")
        return
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = Path(tempfile.gettempdir()) / f"text-bench-gateway-{port}.log"
    env = {"GATEWAY_PIPER_DETERMINISTIC": "true"}
    with started(gateway_command(port), base + "/readyz", log, env=env):
        yield base


def speech(client: httpx.Client, base: str, text: str, **fields: Any) -> dict[str, Any]:
    """The ``speech.audio.done`` event of one SSE request (``audio_ms``)."""
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}
    response = client.post(
        base + "/v1/audio/speech",
        json={**body, **fields, "stream_format": "sse"},
        timeout=120,
    )
    response.raise_for_status()
    lines = response.text.splitlines()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    done = events[-1]
    if done.get("type") != "speech.audio.done":
        raise RuntimeError(f"no audio: {done}")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running gateway's HTTP base URL (default: start one)")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--limit", type=int, default=0, help="the first N replies only")
    args = parser.parse_args(argv)
    replies = load(args.corpus)[: args.limit or None]
    ratios: list[float] = []
    with gateway(args.url) as base, httpx.Client() as client:
        for item in replies:
            heard = speech(client, base, item["text"])["audio_ms"]
            spoken = speech(client, base, item["spoken"], **AS_WRITTEN)["audio_ms"]
            ratio = heard / spoken if spoken else float("inf")
            ratios.append(ratio)
            line = {"kind": "reply", "id": item["id"], "audio_ms": heard}
            line |= {"spoken_audio_ms": spoken, "ratio": round(ratio, 3)}
            print(json.dumps(line), flush=True)
    over = [r for r in ratios if r > TARGET]
    summary = {
        "kind": "summary",
        "replies": len(ratios),
        "target": TARGET,
        "worst_ratio": round(max(ratios), 3),
        "mean_ratio": round(sum(ratios) / len(ratios), 3),
        "over_target": len(over),
        "revision": source_revision(),
        "machine": machine_info(),
    }
    print(json.dumps(summary), flush=True)
    return 0 if not over else 1


if __name__ == "__main__":
    sys.exit(main())
