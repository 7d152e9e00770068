"""The test set-up itself: under CI=true a skip (a missing dependency) fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run_probe(tmp_path: Path, ci: str) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import pytest\n\n"
        "def test_needs_missing_package():\n"
        "    pytest.importorskip('surely_not_an_installed_module_xyz')\n"
    )
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_missing_dependency_fails_under_ci(tmp_path: Path) -> None:
    result = _run_probe(tmp_path, "true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed" in result.stdout
    assert "missing dependency is a failure" in result.stdout


def test_missing_dependency_skips_outside_ci(tmp_path: Path) -> None:
    result = _run_probe(tmp_path, "false")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
