"""Fixtures: a real gateway process (synthetic engine) for the whole run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from voice_gateway_wire.testing import Gateway, gateway_fixture

#: the checkout whose gateway the tests start
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    yield from gateway_fixture(
        ROOT, tmp_path_factory, "gateway", engine="synthetic", log_level="debug"
    )


@pytest.fixture(scope="session")
def piper_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The default engine: the real Piper voice the gateway ships."""
    yield from gateway_fixture(
        ROOT, tmp_path_factory, "piper", engine="piper", deterministic="true"
    )


@pytest.fixture(scope="session")
def no_resume_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway that does not resume sessions (``resume_window_s`` 0): a
    dropped connection ends its session, as before protocol 2.1.0."""
    yield from gateway_fixture(
        ROOT, tmp_path_factory, "no-resume", engine="synthetic", resume_window_s=0
    )


@pytest.fixture(scope="session")
def quick_idle_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway that closes a session after 1.5 s without activity."""
    yield from gateway_fixture(
        ROOT, tmp_path_factory, "idle", engine="synthetic", idle_timeout_s=1.5
    )
