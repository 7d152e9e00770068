"""The chime engine's part of voice-gateway's contract suite, registered
under the ``voice_gateway.engine_tests`` entry point."""

from __future__ import annotations

import numpy as np

from gateway.engines.contract import ContractHooks, Patch


def fail_segment(patch: Patch, marker: str) -> None:
    """The marked segment's renderer fails at its second chunk."""
    from chime_engine.engine import Chime

    render = Chime.render

    def failing(self: Chime, start: int, stop: int) -> np.ndarray:
        if marker in self.text and start > 0:
            raise RuntimeError("injected render failure")
        return render(self, start, stop)

    patch(Chime, "render", failing)


HOOKS = ContractHooks(fail_segment=fail_segment)
