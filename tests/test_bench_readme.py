"""The README's "Performance" section is generated from the committed results
file, and the harness runs end to end (the latter is ``slow``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.bench.report import MARKDOWN_RESULTS, load, performance_section, readme_section
from tests.conftest import RunningServer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "latest.jsonl"


def test_readme_performance_section_matches_the_results_file() -> None:
    section = readme_section(ROOT / "README.md")
    assert section is not None, "README.md has no '## Performance' section"
    markdown = load(RESULTS.parent / MARKDOWN_RESULTS)
    assert "### Markdown replies" in section
    assert section == performance_section(load(RESULTS), markdown), (
        "README.md's Performance section is stale: run `python -m gateway bench-readme`"
    )


@pytest.mark.slow
def test_harness_runs_every_scenario(piper_server: RunningServer, tmp_path: Path) -> None:
    from gateway.bench.runner import parse_args, run

    out = tmp_path / "r.jsonl"
    args = parse_args(
        [
            "--url", piper_server.ws_url, "--utterances", "2", "--levels", "1,2",
            "--capacity-utterances", "1", "--warmup", "1",
            "--out", str(out), "--report", str(tmp_path / "r.html"),
        ]
    )  # fmt: skip
    assert run(args) == 0
    lines = load(out)
    kinds = {line["kind"] for line in lines}
    assert {"run", "utterance", "summary", "capacity", "harness", "timeline"} <= kinds
    assert (tmp_path / "r.html").read_text().count("<svg") >= 3
