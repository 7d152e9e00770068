"""The engine contract (``tests/engine/test_contract.py``) run over the
``orpheus`` engine against the real vLLM.

The contract suite leaves orpheus out (its hooks' ``external``, in
``gateway/engines/orpheus/contract.py``: it needs a vLLM that suite cannot
start) and is imported here whole; the ``engine`` fixture
below replaces its own with a started orpheus engine (the fixture's vLLM,
the tiny model's tokenizer, a seeded random SNAC).  Every segment speaks the
tiny model's whole chain (60 frames, 5.1 s), whatever its text, except
where ``max_tokens`` (from the text's length) cuts it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from gateway.engines.base import Engine
from gateway.engines.registry import create_engine
from tests.engine.test_contract import *  # noqa: F403
from tests_vllm.conftest import VllmServer, orpheus_settings


@pytest_asyncio.fixture(scope="module", loop_scope="session")  # type: ignore[no-redef]
async def engine(vllm_server: VllmServer, snac_folder: Path) -> AsyncIterator[Engine]:
    started = create_engine(orpheus_settings(vllm_server, snac_folder))
    await started.start()
    assert started.name == "orpheus" and started.ready()
    yield started
    await started.aclose()
