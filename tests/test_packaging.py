"""The built wheel carries every file the server reads at run time.

The list is the code's own (``gateway.ops.resources.RUNTIME_PATHS``), not a copy:
a new run-time file named there and left out of the package data fails here.
The wheel is built from a copy of exactly what a wheel build sees
(``pyproject.toml``, ``README.md``, ``gateway/``), without build isolation so
no package index is needed, and then unpacked and served from an unrelated
working directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from gateway.ops import resources
from tests.helpers import ROOT, serve_process


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(ROOT / "gateway", src / "gateway", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            str(src),
            "-w",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = out.glob("voice_gateway-*.whl")
    return built


def test_runtime_paths_are_inside_the_package() -> None:
    files = resources.runtime_files()
    assert Path("gateway/web/index.html") in files
    assert Path("gateway/data/calibration.txt") in files
    for path in resources.RUNTIME_PATHS:
        assert path.exists(), path
        assert path.is_relative_to(resources.PACKAGE_DIR), path


def test_no_module_locates_files_by_itself() -> None:
    """Only gateway/ops/resources.py may turn the package location into file
    paths: any other ``__file__`` use is a run-time file the wheel test
    cannot see."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "gateway").rglob("*.py")
        if path.name != "resources.py" and re.search(r"\b__file__\b", path.read_text())
    ]
    assert offenders == []


def test_wheel_contains_every_runtime_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = [str(p) for p in resources.runtime_files() if p.as_posix() not in names]
    assert missing == []


def test_wheel_requires_the_wire_package_by_name(wheel: Path) -> None:
    """The wire format comes from ``voice-gateway-wire`` (integrations/wire),
    a plain requirement a published wheel can carry: not vendored, no path."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [
            line.removeprefix("Requires-Dist:").strip()
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
        names = set(archive.namelist())
    (wire,) = [r for r in requires if r.startswith("voice-gateway-wire")]
    assert "@" not in wire and "<0.2" in wire, wire  # by name and version, never a path
    assert not any(name.startswith("voice_gateway_wire/") for name in names)


def test_unpacked_wheel_serves_the_demo_page_from_elsewhere(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "data").mkdir()
    with serve_process(
        tmp_path / "data", package_root=site, cwd=elsewhere, engine="synthetic"
    ) as server:
        page = httpx.get(server.base + "/", timeout=10)
        assert page.status_code == 200
        assert page.text == (ROOT / "gateway" / "web" / "index.html").read_text()
        script = httpx.get(server.base + "/client.js", timeout=10)
        assert script.status_code == 200
        # the same interpreter and search path as the server: the unpacked
        # wheel, not the checkout, is the ``gateway`` it imported
        imported = subprocess.run(
            [sys.executable, "-c", "import gateway, sys; sys.stdout.write(gateway.__file__)"],
            cwd=elsewhere,
            env={**os.environ, "PYTHONPATH": str(site)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert imported.stdout == str(site / "gateway" / "__init__.py"), imported.stderr
