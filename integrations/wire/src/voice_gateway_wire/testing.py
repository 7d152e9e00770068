"""Test support for the plugins: a real gateway process on loopback, and a
TCP proxy that drops every connection at once (``DroppingProxy``).

``python -m gateway serve`` runs from a checkout of the gateway (``root``)
with the gateway's own interpreter (``VOICE_GATEWAY_PYTHON``, default the
checkout's ``.venv/bin/python``), so the framework under test and the gateway
never share an environment.  Its output goes to a log file the tests read (a
pipe could fill up).  Standard library only; both plugins' test suites use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

#: the longest a gateway may take to answer ``/readyz`` (Piper loads its voice)
READY_TIMEOUT_S = 180.0


def gateway_python(root: Path) -> str:
    """The interpreter that runs the gateway: ``VOICE_GATEWAY_PYTHON``, else
    the checkout's ``.venv/bin/python``."""
    return os.environ.get("VOICE_GATEWAY_PYTHON", str(root / ".venv" / "bin" / "python"))


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    base = http  #: the same, by the name the gateway's own tests use

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/audio/speech/stream"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def metric(self, name: str) -> float:
        """One unlabelled sample of the gateway's Prometheus ``/metrics``."""
        with urllib.request.urlopen(self.http + "/metrics", timeout=10) as response:
            text = response.read().decode()
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        assert match, f"{name} not in /metrics"
        return float(match.group(1))

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


#: the gateway's drain on SIGTERM waits for live sessions; tests end quickly
FAST_EXIT = {"drain_timeout_s": 1}


class TempDirs(Protocol):
    """What a fixture needs of pytest's ``tmp_path_factory``."""

    def mktemp(self, basename: str) -> Path: ...


def gateway_fixture(
    root: Path, tmp_dirs: TempDirs, name: str, **settings: Any
) -> Iterator[Gateway]:
    """The body of a plugin's gateway fixture: ``gateway_process`` with a
    fresh data folder ``name`` and a quick exit (``FAST_EXIT``); use it as
    ``yield from gateway_fixture(ROOT, tmp_path_factory, "gateway", engine="synthetic")``."""
    with gateway_process(root, tmp_dirs.mktemp(name), **{**FAST_EXIT, **settings}) as server:
        yield server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def gateway_process(
    root: Path,
    data_dir: Path,
    *,
    python: str | None = None,
    cwd: Path | None = None,
    port: int | None = None,
    **settings: object,
) -> Iterator[Gateway]:
    """``python -m gateway serve`` with the ``gateway`` package imported from
    ``root`` (a checkout, or an unpacked wheel; a checkout's
    ``integrations/wire`` too), run by ``python`` (default
    ``gateway_python(root)``) in ``cwd`` (default ``root``) on ``port`` (a
    free one by default), each other keyword a ``GATEWAY_*`` setting.  Output
    goes to a log file in ``data_dir`` (a pipe could fill up and block a
    chatty server).  Ready (``/readyz``) when yielded, stopped with SIGTERM
    (then SIGKILL) after."""
    port = port or free_port()
    # a checkout's own wire package first: the gateway's interpreter may have
    # another checkout's installed (an editable install shared by worktrees)
    wire = root / "integrations" / "wire" / "src"
    path = [str(root), *([str(wire)] if wire.is_dir() else [])]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "GATEWAY_DATA_DIR": str(data_dir),
        **{f"GATEWAY_{name.upper()}": str(value) for name, value in settings.items()},
    }
    log = data_dir / f"gateway-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [python or gateway_python(root), "-m", "gateway", "serve", "--port", str(port)],
            cwd=cwd or root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    gateway = Gateway(proc, port, log)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert proc.poll() is None, gateway.output()
            assert time.monotonic() < deadline, "gateway did not become ready"
            try:
                with urllib.request.urlopen(gateway.http + "/readyz", timeout=1) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.1)
        yield gateway
    finally:
        gateway.stop()


class DroppingProxy:
    """A loopback TCP proxy that can drop every connection at once (a
    network fault between the agent and the gateway; the gateway itself
    stays up, and new connections are let through at once)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        #: connections accepted so far
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def ws_url(self) -> str:
        """The gateway's streaming endpoint through the proxy."""
        return f"ws://127.0.0.1:{self.port}/v1/audio/speech/stream"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def drop_all(self) -> None:
        """Abort every proxied connection (both sides see a reset)."""
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def aclose(self) -> None:
        self.drop_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
