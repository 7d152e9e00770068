"""Files the server reads at run time, found inside the installed package.

What this module is for: one place that names every non-Python file the
gateway reads while it runs (the demo page, the loudness calibration text),
located relative to the ``gateway`` package through ``importlib.resources`` so
a wheel installed anywhere finds them from any working directory, exactly as a
source checkout does.  ``pyproject.toml`` ships them as package data and
``tests/test_packaging.py`` builds the wheel and checks that every path named
in ``RUNTIME_PATHS`` is inside it.

What it must not do: name a file outside the package (a checkout-only path
such as ``configs/`` would work from the repository and crash from a wheel),
or read anything at import time.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

#: the installed ``gateway`` package directory (a wheel is always unpacked on
#: disk, so this is a real directory that StaticFiles can serve)
PACKAGE_DIR = Path(str(files("gateway")))

#: the browser client and demo page, served at ``/``
WEB_DIR = PACKAGE_DIR / "web"

#: the text the Piper engine's one-off output gain is calibrated on
CALIBRATION_TEXT = PACKAGE_DIR / "data" / "calibration.txt"

#: every run-time path (a directory stands for all the files under it)
RUNTIME_PATHS: tuple[Path, ...] = (WEB_DIR, CALIBRATION_TEXT)


def runtime_files() -> list[Path]:
    """Every run-time file, relative to the package's parent directory
    (``gateway/web/index.html``, ...): the paths a wheel must contain."""
    found: list[Path] = []
    for path in RUNTIME_PATHS:
        members = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        found.extend(p.relative_to(PACKAGE_DIR.parent) for p in members)
    return found
