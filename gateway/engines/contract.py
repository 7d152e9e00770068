"""What the engine contract suite (``tests/engine/test_contract.py``) needs
from an engine beyond its interface, supplied by the engine.

The suite runs over every registered engine.  Most of it needs nothing but
the interface; one test makes a single segment fail inside the engine (the
failure must be the engine's own, injected into its real model call), and
an engine may need settings to start, or a server the suite cannot start.
An engine says so with a ``ContractHooks``:

* ``fail_segment(patch, marker)``: make every segment whose text contains
  ``marker`` fail inside the engine, by patching with ``patch(target, name,
  value)`` (pytest's ``monkeypatch.setattr``, undone after the test);
* ``settings``: the settings the engine needs to start in the tests
  (section fields included: ``{"myengine": {"model": "..."}}``);
* ``external``: why the contract runs from another suite instead (that
  suite imports the tests and supplies the started engine), "" if not.

Built-in engines name theirs below (``"name": "module:attribute"``, like
``registry.ENGINES``); a third-party engine registers its hooks under the
entry-point group ``voice_gateway.engine_tests``, with the same name as in
``voice_gateway.engines`` (``myengine = "my_package.contract:HOOKS"``), and
passes the suite without an edit to the gateway's tests.  This module
imports no test framework, and a hooks module should import the engine's
heavy parts only inside ``fail_segment``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

#: the entry-point group third-party engines register their hooks under
ENTRY_POINT_GROUP = "voice_gateway.engine_tests"

#: ``patch(target, name, value)``: pytest's ``monkeypatch.setattr``
Patch = Callable[[Any, str, Any], None]


@dataclass(frozen=True)
class ContractHooks:
    """An engine's part of the contract suite (see the module)."""

    fail_segment: Callable[[Patch, str], None] | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    external: str = ""


HOOKS: dict[str, str] = {
    "piper": "gateway.engines.piper.contract:HOOKS",
    "upstream": "gateway.engines.upstream.contract:HOOKS",
    "orpheus": "gateway.engines.orpheus.contract:HOOKS",
    "synthetic": "gateway.engines.synthetic:CONTRACT_HOOKS",
}


def contract_hooks(name: str) -> ContractHooks | None:
    """The hooks engine ``name`` supplies, or None (it registered none)."""
    target = HOOKS.get(name)
    if target is None:
        found = [e.value for e in metadata.entry_points(group=ENTRY_POINT_GROUP, name=name)]
        target = found[0] if found else None
    if target is None:
        return None
    module_name, _, attr = target.partition(":")
    hooks = getattr(importlib.import_module(module_name), attr)
    if not isinstance(hooks, ContractHooks):
        raise TypeError(f"{target} is not a ContractHooks")
    return hooks
