"""vllm-omni 0.30's own client against a real gateway.

Kept out of the main suite (``testpaths = ["tests"]``): vllm-omni 0.30's
code imports vLLM 0.30's internals, so it runs from a virtualenv of its own
(``.venv-vllm-omni``, made by ``scripts/setup-vllm-omni``; ``OMNI_PYTHON``
names another interpreter), and these tests run as their own step
(``scripts/test-vllm-omni``, a step of ``.ci/run``).  The gateway under test
runs from the main ``.venv`` as a separate process (``serve_process``: the
Piper engine, its default voice); the tests run ``omni_client.py`` with
``.venv-vllm-omni``'s interpreter and read the JSON it prints.  A missing
``.venv-vllm-omni`` fails the tests; nothing here is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ServeProcess, serve_process

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
OMNI_PYTHON = Path(os.environ.get("OMNI_PYTHON", ROOT / ".venv-vllm-omni" / "bin" / "python"))
PROMPTS = HERE / "prompts.txt"
#: the marked line omni_client.py prints its result on
MARK = "OMNI-CLIENT-RESULT "
#: vllm-omni's import (≈ 10 s) and a benchmark run on a loaded 2-core machine
CLIENT_TIMEOUT_S = 300


def omni_client(*args: str, stdin: Any = None) -> dict[str, Any]:
    """Run ``omni_client.py`` with vllm-omni 0.30's interpreter; its result."""
    assert OMNI_PYTHON.exists(), f"{OMNI_PYTHON} is missing: run scripts/setup-vllm-omni"
    done = subprocess.run(
        [str(OMNI_PYTHON), str(HERE / "omni_client.py"), *args],
        input=None if stdin is None else json.dumps(stdin),
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
        cwd=HERE,  # not the checkout: the gateway package is not on its path
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    failure = (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0 and lines, failure
    result: dict[str, Any] = json.loads(lines[-1][len(MARK) :])
    return result


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A gateway process on the Piper engine, as a user starts it (Piper
    deterministic: the same text gives the same audio, to compare with)."""
    data_dir = tmp_path_factory.mktemp("omni-gateway")
    with serve_process(data_dir, engine="piper", piper_deterministic="true") as server:
        yield server
