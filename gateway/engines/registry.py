"""Engine registry: a name maps to ``"module:Class"``, imported on demand.

This is uvicorn's shape for its loop and protocol implementations: adding an
engine is one line here and one module, never a branch in the session code.
"""

from __future__ import annotations

import importlib

from gateway.engines.base import Engine
from gateway.settings import Settings

ENGINES: dict[str, str] = {
    "piper": "gateway.engines.piper:PiperEngine",
    # a relay to a pool of OpenAI-compatible speech servers (vllm-omni, ...)
    "upstream": "gateway.engines.upstream.engine:UpstreamEngine",
    # a tone generator with realistic timing: a load-testing tool, never the default
    "synthetic": "gateway.engines.synthetic:SyntheticEngine",
}


class UnknownEngineError(LookupError):
    pass


def engine_class(name: str) -> type[Engine]:
    try:
        target = ENGINES[name]
    except KeyError:
        known = ", ".join(sorted(ENGINES))
        raise UnknownEngineError(f"unknown engine {name!r}; known engines: {known}") from None
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise TypeError(f"{target} is not an Engine")
    return cls


def create_engine(settings: Settings) -> Engine:
    return engine_class(settings.engine)(settings)
