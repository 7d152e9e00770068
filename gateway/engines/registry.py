"""Engine registry: a name maps to ``"module:Class"``, imported on demand.

This is uvicorn's shape for its loop and protocol implementations: adding an
engine is one line here and one module, never a branch in the session code.
A third-party package registers an engine without touching the gateway,
through the entry-point group ``voice_gateway.engines``
(``myengine = "my_package.engine:MyEngine"``); a built-in name cannot be
taken over that way.  Every registered engine runs the contract test suite
(``tests/engine/test_contract.py``).
"""

from __future__ import annotations

import importlib
import logging
from importlib import metadata

from gateway.engines.base import Engine
from gateway.settings import Settings

log = logging.getLogger(__name__)

#: the entry-point group third-party engines register under
ENTRY_POINT_GROUP = "voice_gateway.engines"

ENGINES: dict[str, str] = {
    "piper": "gateway.engines.piper:PiperEngine",
    # a relay to a pool of OpenAI-compatible speech servers (vllm-omni, ...)
    "upstream": "gateway.engines.upstream.engine:UpstreamEngine",
    # Orpheus TTS served by vLLM (a pool of replicas), SNAC decoded here;
    # needs the `orpheus` extra
    "orpheus": "gateway.engines.orpheus.engine:OrpheusEngine",
    # a tone generator with realistic timing: a load-testing tool, never the default
    "synthetic": "gateway.engines.synthetic:SyntheticEngine",
}


class UnknownEngineError(LookupError):
    pass


def registered_engines() -> dict[str, str]:
    """Every engine name and its ``"module:Class"``: built-in first, then
    those of installed packages (read each time: cheap, and a test may
    install one)."""
    engines = dict(ENGINES)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in ENGINES:
            log.warning(
                "entry point %s = %s ignored: %r is a built-in engine",
                entry.name,
                entry.value,
                entry.name,
            )
            continue
        engines.setdefault(entry.name, entry.value)
    return engines


def engine_class(name: str) -> type[Engine]:
    engines = registered_engines()
    try:
        target = engines[name]
    except KeyError:
        known = ", ".join(sorted(engines))
        raise UnknownEngineError(f"unknown engine {name!r}; known engines: {known}") from None
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise TypeError(f"{target} is not an Engine")
    return cls


def create_engine(settings: Settings) -> Engine:
    return engine_class(settings.engine)(settings)
