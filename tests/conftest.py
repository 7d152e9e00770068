"""Shared fixtures: real uvicorn servers on loopback ports, real engines.

Servers run in-process (one thread and event loop each) so several can share
one warmed engine; clients are real ``websockets`` connections over TCP.

Under ``CI=true`` a skipped test is a failure: a missing dependency must
never pass quietly (see ``tests/test_setup.py``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
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
