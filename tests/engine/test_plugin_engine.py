"""The example third-party engine (``plugin_engine/``: ``chime``) reaches the
contract suite through its entry points alone: ``tests/engine/conftest.py``
installs its distribution metadata, and ``test_contract.py``, which names no
such engine, runs over it (``test_contract.py::*[chime]``)."""

from __future__ import annotations

from gateway.engines import contract, registry
from gateway.engines.contract import contract_hooks
from gateway.engines.registry import create_engine, registered_engines
from tests import conftest
from tests.engine import test_contract


def test_the_plugin_is_registered_through_its_entry_points_only() -> None:
    assert "chime" not in registry.ENGINES and "chime" not in contract.HOOKS
    assert registered_engines()["chime"] == "chime_engine.engine:ChimeEngine"
    hooks = contract_hooks("chime")
    assert hooks is not None and hooks.fail_segment is not None
    assert hooks.fail_segment.__module__ == "chime_engine.contract"
    assert create_engine(conftest.test_settings(engine="chime")).name == "chime"


def test_the_contract_suite_runs_over_it() -> None:
    assert test_contract._runs_here("chime")
    assert not test_contract._runs_here("orpheus")  # its hooks send it to tests_vllm/


def test_an_engine_without_hooks_has_none() -> None:
    assert contract_hooks("no-such-engine") is None
