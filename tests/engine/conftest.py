"""The example third-party engine (``plugin_engine/``, the ``chime`` engine)
is installed for every engine test: its ``.dist-info`` is written, as pip
would write it, from its own ``pyproject.toml`` into a temporary folder on
``sys.path``, beside its package's folder.  ``importlib.metadata`` then finds
its two entry points (``voice_gateway.engines``,
``voice_gateway.engine_tests``) like those of any installed distribution, so
the contract suite (``test_contract.py``) runs over it with no edit there.
This happens when this conftest is imported, before the suite's parameters
are collected."""

from __future__ import annotations

import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parent / "plugin_engine"


def _install(source: Path) -> Path:
    """Write ``source``'s distribution metadata into a new folder: METADATA
    and entry_points.txt (from ``[project]``), top_level.txt."""
    pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    project = pyproject["project"]
    root = Path(tempfile.mkdtemp(prefix="gateway-plugin-"))
    name = project["name"].replace("-", "_")
    info = root / f"{name}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project.get("entry-points", {})
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
            for group, entries in groups.items()
        )
    )
    packages = pyproject["tool"]["setuptools"]["packages"]
    (info / "top_level.txt").write_text("".join(f"{p}\n" for p in packages))
    return root


_METADATA = _install(PLUGIN)
sys.path[:0] = [str(PLUGIN), str(_METADATA)]


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_METADATA, ignore_errors=True)
