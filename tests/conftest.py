"""Shared fixtures: real uvicorn servers on loopback ports, real engines.

Servers run in-process (one thread and event loop each) so several can share
one warmed engine; clients are real ``websockets`` connections over TCP.

Under ``CI=true`` a skipped test is a failure: a missing dependency must
never pass quietly (see ``tests/test_setup.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
import uvicorn

from gateway.app import create_app
from gateway.cli import uvicorn_options
from gateway.engines.base import Engine
from gateway.engines.registry import create_engine
from gateway.settings import Settings, load_settings


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true (a missing dependency is a failure): {reason}"


@dataclass
class RunningServer:
    url: str  #: ws://127.0.0.1:PORT
    http: str  #: http://127.0.0.1:PORT
    settings: Settings
    app: Any
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def ws_url(self) -> str:
        return self.url + "/v1/audio/speech/stream"

    @property
    def state(self) -> Any:
        return self.app.state.gateway


def test_settings(**overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "piper": {"deterministic": True},
        # fixed slots: tests do not depend on this machine's measured speed
        # (automatic admission has its own tests: tests/test_automatic_admission.py)
        "max_active_streams": 20,
        # a dropped connection ends its session at once, as before protocol
        # 2.1: the tests of dropped connections assert that end; resume
        # (default 30 s) has its own tests, which set it (tests/test_resume.py)
        "resume_window_s": 0,
        "data_dir": os.environ.get("GATEWAY_TEST_DATA_DIR", ".data"),
    }
    base.update(overrides)
    return load_settings(None, overrides=base, environ={})


@contextmanager
def run_server(settings: Settings, engine: Engine | None) -> Iterator[RunningServer]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(settings, engine=engine)
    options = uvicorn_options(settings)
    options.update(port=port, log_level="warning")
    options.pop("log_config")
    config = uvicorn.Config(app, **options)  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(600):
        if server.started:
            break
        threading.Event().wait(0.02)
    else:
        raise RuntimeError("server did not start")
    try:
        yield RunningServer(
            url=f"ws://127.0.0.1:{port}",
            http=f"http://127.0.0.1:{port}",
            settings=settings,
            app=app,
            server=server,
            thread=thread,
        )
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def _start_engine(settings: Settings) -> Engine:
    engine = create_engine(settings)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(engine.start())
    finally:
        loop.close()
    return engine


@pytest.fixture(scope="session")
def piper_engine() -> Iterator[Engine]:
    engine = _start_engine(test_settings(engine="piper"))
    yield engine
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.aclose())
    loop.close()


@pytest.fixture(scope="session")
def synthetic_engine() -> Engine:
    return _start_engine(test_settings(engine="synthetic"))


@pytest.fixture(scope="session")
def upstream_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real ``python -m gateway serve`` process (synthetic engine): the
    upstream of the ``upstream`` engine in engine-level tests."""
    from tests.helpers import serve_process

    with serve_process(tmp_path_factory.mktemp("upstream-replica"), engine="synthetic") as proc:
        yield proc


def upstream_settings(*urls: str, **upstream: Any) -> Settings:
    config = {
        "urls": list(urls),
        "health_path": "/healthz",
        "ready_paths": ["/v1/audio/voices"],
        "probe_interval_s": 0.5,
        "send_sample_rate": True,  # the replica's own rate: nothing resampled twice
        **upstream,
    }
    return test_settings(engine="upstream", upstream=config)


@pytest_asyncio.fixture(loop_scope="function")
async def upstream_engine(upstream_replica: Any) -> AsyncIterator[Engine]:
    """The ``upstream`` engine in front of ``upstream_replica``, started in
    the test's own event loop (its HTTP connections belong to that loop)."""
    engine = create_engine(upstream_settings(upstream_replica.base))
    await engine.start()
    yield engine
    await engine.aclose()


@pytest.fixture(scope="session")
def piper_server(piper_engine: Engine) -> Iterator[RunningServer]:
    with run_server(test_settings(engine="piper"), piper_engine) as server:
        yield server


@pytest.fixture
def server_factory(piper_engine: Engine) -> Iterator[Callable[..., RunningServer]]:
    """Start extra servers with other settings on the shared Piper engine."""
    stack: list[Any] = []

    def start(engine: Engine | None = None, **overrides: Any) -> RunningServer:
        settings = test_settings(engine="piper", **overrides)
        cm = run_server(settings, engine or piper_engine)
        stack.append(cm)
        return cm.__enter__()

    yield start
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


@pytest.fixture
def server_log() -> Iterator[LogCollector]:
    """What the in-process servers log during one test (``LogCollector``)."""
    handler = LogCollector()
    loggers = [logging.getLogger(name) for name in LogCollector.LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


class LogCollector(logging.Handler):
    """Everything in-process servers log (uvicorn's loggers do not propagate
    to the root logger, so pytest's ``caplog`` misses them); the
    ``server_log`` fixture installs one."""

    LOGGERS = ("", "uvicorn", "uvicorn.error", "asyncio")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def no_traceback(log: LogCollector) -> None:
    """A client's mistake must never leave a traceback in the server's log."""
    assert "Traceback" not in log.text, log.text
    assert "Exception in callback" not in log.text, log.text
