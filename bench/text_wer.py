"""Normalization is heard: a speech recognizer's word error rate on replies
with numbers, dates and addresses, against the spoken form's own audio
(issue 21's target: within 0.05 of it).

    .venv/bin/pip install pocketsphinx      # the `bench` extra
    .venv/bin/python bench/text_wer.py [--limit N] [--url http://...]

Starts ``python -m gateway serve`` with Piper deterministic (or uses
``--url``).  For each reply of ``bench/text_corpus/numbers.jsonl`` it asks
``POST /v1/audio/speech`` for 16 kHz ``pcm`` of the reply as the client sends
it (the front-end's defaults) and of its hand-written spoken form read as
written (``input_format: "plain"``, ``normalize: false``), recognizes both
with pocketsphinx (its wheel's English model) and scores each against the
spoken form.  Prints one JSON line per reply and a summary (the two mean
WERs and their difference).  The recognizer is deterministic, so one run is
enough; the figure depends on the voice as much as on the text.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
from text_markup_ratio import AS_WRITTEN, ROOT, gateway, load

from gateway.bench.provenance import source_revision
from gateway.bench.runner import machine_info

CORPUS = ROOT / "text_corpus" / "numbers.jsonl"
TARGET = 0.05
RATE = 16_000


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def wer(reference: list[str], hypothesis: list[str]) -> float:
    """Word error rate: edit distance over the reference's length."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i]
        for j, hyp in enumerate(hypothesis, 1):
            cost = 0 if ref == hyp else 1
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost))
        previous = current
    return previous[-1] / max(1, len(reference))


def pcm(client: httpx.Client, base: str, text: str, **fields: Any) -> bytes:
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}
    response = client.post(
        base + "/v1/audio/speech",
        json={**body, **fields, "stream": False, "sample_rate": RATE},
        timeout=120,
    )
    response.raise_for_status()
    return response.content


def recognizer() -> Any:
    try:
        from pocketsphinx import Decoder
    except ImportError:
        raise SystemExit("needs pocketsphinx: .venv/bin/pip install pocketsphinx") from None
    return Decoder(samprate=RATE, loglevel="FATAL")


def recognize(decoder: Any, audio: bytes) -> str:
    decoder.start_utt()
    decoder.process_raw(audio, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    return "" if hyp is None else str(hyp.hypstr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running gateway's HTTP base URL (default: start one)")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--limit", type=int, default=0, help="the first N replies only")
    args = parser.parse_args(argv)
    replies = load(args.corpus)[: args.limit or None]
    decoder = recognizer()
    reply_wers: list[float] = []
    spoken_wers: list[float] = []
    with gateway(args.url) as base, httpx.Client() as client:
        for item in replies:
            reference = words(item["spoken"])
            heard = recognize(decoder, pcm(client, base, item["text"]))
            own = recognize(decoder, pcm(client, base, item["spoken"], **AS_WRITTEN))
            reply_wers.append(wer(reference, words(heard)))
            spoken_wers.append(wer(reference, words(own)))
            line = {"kind": "reply", "id": item["id"], "wer": round(reply_wers[-1], 3)}
            line |= {"spoken_form_wer": round(spoken_wers[-1], 3), "heard": heard}
            print(json.dumps(line), flush=True)
    mean_reply = sum(reply_wers) / len(reply_wers)
    mean_spoken = sum(spoken_wers) / len(spoken_wers)
    summary = {
        "kind": "summary",
        "replies": len(reply_wers),
        "wer": round(mean_reply, 3),
        "spoken_form_wer": round(mean_spoken, 3),
        "difference": round(mean_reply - mean_spoken, 3),
        "target": TARGET,
        "revision": source_revision(),
        "machine": machine_info(),
    }
    print(json.dumps(summary), flush=True)
    return 0 if mean_reply - mean_spoken <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
