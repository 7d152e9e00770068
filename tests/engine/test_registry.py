"""Engines registered from outside the repository, through the
``voice_gateway.engines`` entry-point group: a tiny engine package is written
to a temporary folder with its ``.dist-info`` (as pip would install it) and
put on ``sys.path``; ``importlib.metadata`` finds it like any installed
distribution."""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gateway.engines.base import AudioChunk, SegmentRequest, StreamRequest
from gateway.engines.registry import (
    ENTRY_POINT_GROUP,
    UnknownEngineError,
    create_engine,
    engine_class,
    registered_engines,
)
from tests import conftest

ENGINE_MODULE = '''
"""A third-party engine: the synthetic tones under another name."""
from gateway.engines.synthetic import SyntheticEngine


class OctaveEngine(SyntheticEngine):
    name = "octave"
'''


def install(root: Path, entry_points: str) -> None:
    package = root / "octave_engine"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(ENGINE_MODULE))
    info = root / "octave_engine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: octave-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{entry_points}\n")


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[Path]:
    install(tmp_path, "octave = octave_engine:OctaveEngine\npiper = octave_engine:OctaveEngine")
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("octave_engine", None)


def test_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(UnknownEngineError, match="piper, synthetic"):
        engine_class("nope")


async def test_an_entry_point_engine_is_registered_and_speaks(installed: Path) -> None:
    assert registered_engines()["octave"] == "octave_engine:OctaveEngine"
    engine = create_engine(conftest.test_settings(engine="octave"))
    assert type(engine).__name__ == "OctaveEngine" and engine.name == "octave"
    await engine.start()
    stream = engine.open_stream(StreamRequest(engine.default_voice().name))
    events = [e async for e in stream.submit(SegmentRequest("Hello there."))]
    audio = np.concatenate([e.samples for e in events if isinstance(e, AudioChunk)])
    assert audio.size > 0
    await engine.aclose()


def test_an_entry_point_cannot_replace_a_built_in_engine(
    installed: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.engines.registry"):
        engines = registered_engines()
    assert engines["piper"] == "gateway.engines.piper:PiperEngine"
    assert "built-in" in caplog.text


def test_without_the_package_the_name_is_unknown() -> None:
    assert "octave" not in registered_engines()
