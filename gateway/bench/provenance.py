"""Which code a benchmark measured: the git commit of the running package.

What this module is for: a results file must say what it measured.  When
the ``gateway`` package is imported from a git checkout (the package's parent
directory is the top of a work tree), the record is ``git rev-parse HEAD``
plus whether tracked or untracked-but-not-ignored files differ from it; from
an installed wheel (or anywhere git cannot answer) it is ``unknown``.  A
wheel installed into a virtualenv that lives inside some checkout is not
mistaken for that checkout: the work tree's top must be the package's parent.

What it must not do: fail a benchmark because git is missing or slow (every
call is bounded and its failure means ``unknown``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from gateway.ops.resources import PACKAGE_DIR

UNKNOWN = "unknown"
_GIT_TIMEOUT_S = 10.0


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_revision(root: Path = PACKAGE_DIR.parent) -> dict[str, Any]:
    """``{"commit": sha or "unknown", "dirty": bool or None}`` for the code in
    ``root`` (by default the directory the running ``gateway`` came from)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return {"commit": UNKNOWN, "dirty": None}
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain")
    if commit is None or status is None:
        return {"commit": UNKNOWN, "dirty": None}
    return {"commit": commit, "dirty": status != ""}
