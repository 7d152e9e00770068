"""The Piper engine (``piper``): the default voice, streamed chunk by chunk.

Requires the ``gateway[piper]`` extra (piper-tts is GPL-3.0-or-later).
``PiperEngine`` is imported on first use: ``gateway.settings`` reads this
package's ``settings`` section whatever the engine, without loading torch
(or setting torch's ``OMP_WAIT_POLICY``, which ``engine`` does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.engines.piper.engine import PiperEngine

__all__ = ["PiperEngine"]


def __getattr__(name: str) -> object:
    if name == "PiperEngine":
        from gateway.engines.piper.engine import PiperEngine

        return PiperEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
