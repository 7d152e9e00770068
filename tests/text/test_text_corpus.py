"""The text corpus (bench/text_corpus): well formed, big enough, and read by
the front-end as its hand-written spoken form (words compared, punctuation
and case aside), whatever the token split."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from gateway.text.frontend import FrontEnd, FrontEndOptions
from gateway.text.segmenter import Segmenter

CORPUS = Path(__file__).resolve().parents[2] / "bench" / "text_corpus"


def load(name: str) -> list[dict[str, str]]:
    with (CORPUS / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def words(text: str) -> list[str]:
    return re.sub(r"[^\w' ]", " ", text.lower()).split()


def spoken(text: str, chunks: int, seed: int) -> str:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(chunks, len(text) - 1)))
    seg = Segmenter("auto", input_format="markdown")
    fe = FrontEnd(FrontEndOptions())
    out: list[str] = []
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        out += [fe.process(s).text for s in seg.push(text[a:b])]
    out += [fe.process(s).text for s in seg.flush()]
    fe.finish()
    return " ".join(out)


@pytest.mark.parametrize(("name", "minimum"), [("markdown.jsonl", 40), ("numbers.jsonl", 30)])
def test_corpus_files(name: str, minimum: int) -> None:
    replies = load(name)
    assert len(replies) >= minimum
    assert len({r["id"] for r in replies}) == len(replies)
    for r in replies:
        assert set(r) == {"id", "text", "spoken"}
        assert r["text"].strip() and r["spoken"].strip()


ALL = load("markdown.jsonl") + load("numbers.jsonl")


@pytest.mark.parametrize("reply", ALL, ids=lambda r: r["id"])
def test_the_front_end_reads_the_hand_written_spoken_form(reply: dict[str, str]) -> None:
    expected = words(reply["spoken"])
    assert words(spoken(reply["text"], 0, 0)) == expected
    assert words(spoken(reply["text"], len(reply["text"]) // 3, 1)) == expected
