"""``python -m gateway bench``: ``--help`` names the scenarios, and a results
file records the commit it measured (``unknown`` from a wheel: see
``tests/test_packaging.py``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.bench.provenance import source_revision
from gateway.bench.report import performance_section
from gateway.bench.runner import SCENARIOS
from gateway.engines.base import Engine
from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as settings_for
from tests.helpers import ROOT


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_help_lists_every_scenario() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert len(SCENARIOS) == 7
    for name in SCENARIOS:
        assert f"\n  {name} " in done.stdout, name


def test_revision_of_a_checkout_and_its_dirty_flag(tmp_path: Path) -> None:
    repo = tmp_path / "checkout"
    (repo / "gateway").mkdir(parents=True)
    (repo / "gateway" / "__init__.py").write_text("")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = _git(repo, "rev-parse", "HEAD")
    assert source_revision(repo) == {"commit": head, "dirty": False}
    (repo / "gateway" / "__init__.py").write_text("x = 1\n")
    assert source_revision(repo) == {"commit": head, "dirty": True}
    # a directory inside a work tree but not its top (a wheel installed into
    # a virtualenv kept in a checkout) is not that checkout
    inner = repo / ".venv" / "site-packages"
    inner.mkdir(parents=True)
    assert source_revision(inner) == {"commit": "unknown", "dirty": None}
    assert source_revision(tmp_path / "nowhere") == {"commit": "unknown", "dirty": None}


@pytest.fixture(scope="module")
def synthetic_server(synthetic_engine: Engine) -> Iterator[RunningServer]:
    with run_server(settings_for(engine="synthetic"), synthetic_engine) as server:
        yield server


def _bench_run_line(
    server: RunningServer, out: Path, pythonpath: Path, cwd: Path
) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "--url", server.ws_url,
         "--scenarios", "flush", "--utterances", "1", "--warmup", "0",
         "--out", str(out), "--report", ""],
        cwd=cwd,
        env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    run = lines[0]
    assert run["kind"] == "run"
    return dict(run)


def test_results_record_the_checkout_commit(
    synthetic_server: RunningServer, tmp_path: Path
) -> None:
    run = _bench_run_line(synthetic_server, tmp_path / "r.jsonl", ROOT, tmp_path)
    dirty = _git(ROOT, "status", "--porcelain") != ""
    assert run["source"] == {"commit": _git(ROOT, "rev-parse", "HEAD"), "dirty": dirty}


def test_results_from_a_copy_outside_git_say_unknown(
    synthetic_server: RunningServer, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    shutil.copytree(
        ROOT / "gateway", site / "gateway", ignore=shutil.ignore_patterns("__pycache__")
    )
    run = _bench_run_line(synthetic_server, tmp_path / "r.jsonl", site, tmp_path)
    assert run["source"] == {"commit": "unknown", "dirty": None}


def test_readme_section_names_the_commit() -> None:
    from gateway.bench.report import load

    lines = load(ROOT / "bench" / "results" / "latest.jsonl")
    with_source = [
        {**line, "source": {"commit": "0123456789abcdef", "dirty": True}}
        if line["kind"] == "run"
        else line
        for line in lines
    ]
    assert "Code: commit 0123456789ab with uncommitted changes." in performance_section(with_source)
