"""Cost of the text front-end per committed segment, over the text corpus.

Prints JSON lines: the machine and versions, then p50/p95/p99 in
milliseconds per segment for the whole front-end (``FrontEnd.process``) and
for each step alone (the Markdown reader, emoji, English normalization, the
SSML reader, ``hold_back`` per pushed token), and, for comparison, a parse of
the same segment by ``markdown-it-py`` and ``mistune`` (not used on the hot
path: neither gives in-line offsets, docs/text.md) and, when importable, by
WeTextProcessing's English normalizer.  The corpus is ``bench/text_corpus``
(Markdown/emoji replies and replies with numbers), cut into segments by the
gateway's segmenter with ``input_format="markdown"``.

    PYTHONPATH=. python bench/text_frontend.py --rounds 20

WeTextProcessing is not a dependency; to measure it, install it in a folder
of its own and put that on the path, e.g.
``pip install --target /tmp/wetext wetextprocessing pynini`` then
``PYTHONPATH=.:/tmp/wetext python bench/text_frontend.py --wetext``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from gateway.bench.provenance import source_revision
from gateway.text.frontend import FrontEnd, FrontEndOptions, hold_back, warm_up
from gateway.text.frontend.emoji import drop_emoji
from gateway.text.frontend.markdown import MarkdownReader
from gateway.text.frontend.normalize.en import normalize
from gateway.text.frontend.ssml import SsmlReader
from gateway.text.segmenter import Segmenter

CORPUS = Path(__file__).parent / "text_corpus"


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def load_corpus() -> list[dict[str, str]]:
    replies: list[dict[str, str]] = []
    for name in ("markdown.jsonl", "numbers.jsonl"):
        with (CORPUS / name).open(encoding="utf-8") as f:
            replies += [json.loads(line) for line in f if line.strip()]
    return replies


def segments_of(text: str) -> list[str]:
    seg = Segmenter("auto", input_format="markdown")
    return seg.push(text) + seg.flush()


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return {
        "n": len(ordered),
        "p50_ms": round(q[49] * 1e3, 4),
        "p95_ms": round(q[94] * 1e3, 4),
        "p99_ms": round(q[98] * 1e3, 4),
        "max_ms": round(ordered[-1] * 1e3, 4),
    }


#: The clock: "cpu" (this thread's CPU time: the work itself, not the time
#: other processes on a shared machine took the core) or "wall".
CLOCK = {"cpu": time.thread_time, "wall": time.perf_counter}
_clock = time.thread_time


def timed(fn: Callable[[], object]) -> float:
    t0 = _clock()
    fn()
    return _clock() - t0


def bench(rounds: int, wetext: bool) -> None:
    warm_up()  # as the server does at start
    replies = load_corpus()
    per_reply = [segments_of(r["text"]) for r in replies]
    flat = [s for segs in per_reply for s in segs]
    steps: dict[str, list[float]] = {
        "frontend": [],
        "frontend_plain_off": [],
        "markdown_reader": [],
        "emoji": [],
        "normalize_en": [],
        "ssml_reader": [],
        "hold_back_per_token": [],
        "markdown_it_py": [],
        "mistune": [],
    }
    md_it = _markdown_it()
    mist = _mistune()
    wetext_normalizer = _wetext() if wetext else None
    if wetext_normalizer is not None:
        steps["wetext_en"] = []
    for _ in range(rounds):
        for segs in per_reply:
            fe = FrontEnd(FrontEndOptions())
            plain = FrontEnd(FrontEndOptions(input_format="plain", normalize=False))
            reader = MarkdownReader()
            for s in segs:
                steps["frontend"].append(timed(lambda s=s, fe=fe: fe.process(s)))
                steps["frontend_plain_off"].append(timed(lambda s=s, p=plain: p.process(s)))
                steps["markdown_reader"].append(timed(lambda s=s, r=reader: r.read(s)))
                steps["emoji"].append(timed(lambda s=s: list(drop_emoji(s))))
                steps["normalize_en"].append(timed(lambda s=s: list(normalize(s))))
                steps["ssml_reader"].append(
                    timed(lambda s=s: SsmlReader().read(s.replace("<", " ")))
                )
                if md_it is not None:
                    steps["markdown_it_py"].append(timed(lambda s=s: md_it(s)))
                if mist is not None:
                    steps["mistune"].append(timed(lambda s=s: mist(s)))
                if wetext_normalizer is not None and _ == 0:
                    steps["wetext_en"].append(timed(lambda s=s: wetext_normalizer(s)))
        # hold_back as the segmenter calls it: on the buffer after each token
        for r in replies:
            text = r["text"]
            for end in range(4, len(text) + 1, 4):  # ~4-character LLM tokens
                buf = text[max(0, end - 300) : end]
                steps["hold_back_per_token"].append(
                    timed(lambda buf=buf: hold_back(buf, "markdown"))
                )
    emit({"kind": "corpus", "replies": len(replies), "segments": len(flat), "rounds": rounds})
    for name, samples in steps.items():
        if samples:
            emit({"kind": "step", "step": name, **percentiles(samples)})


def _markdown_it() -> Callable[[str], object] | None:
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return None
    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    return md.parse


def _mistune() -> Callable[[str], object] | None:
    try:
        import mistune
    except ImportError:
        return None
    md = mistune.create_markdown(renderer=None, plugins=["table", "strikethrough"])
    return md


def _wetext() -> Callable[[str], object] | None:
    try:
        from tn.english.normalizer import Normalizer  # type: ignore[import-not-found]
    except ImportError as exc:
        emit({"kind": "wetext", "error": f"not importable: {exc}"})
        return None
    t0 = time.perf_counter()
    normalizer = Normalizer()
    emit({"kind": "wetext", "load_s": round(time.perf_counter() - t0, 2)})
    return normalizer.normalize  # type: ignore[no-any-return]


def machine() -> dict[str, Any]:
    versions = {}
    for package in ("emoji", "markdown-it-py", "mistune", "num2words", "WeTextProcessing"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "kind": "machine",
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "source": source_revision(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--wetext", action="store_true", help="also time WeTextProcessing (English TN)"
    )
    parser.add_argument("--clock", choices=sorted(CLOCK), default="cpu")
    args = parser.parse_args()
    global _clock
    _clock = CLOCK[args.clock]
    emit(machine() | {"clock": args.clock})
    bench(args.rounds, args.wetext)


if __name__ == "__main__":
    main()
