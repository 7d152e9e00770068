"""An engine's ``Capabilities`` as clients see them (``session.created``).

Kept out of ``base.py`` so the engine interface does not import the protocol.
"""

from __future__ import annotations

from gateway import protocol
from gateway.engines.base import Capabilities


def capabilities_message(caps: Capabilities) -> protocol.EngineCapabilities:
    return protocol.EngineCapabilities(
        sample_rates=list(caps.sample_rates),
        alignment=caps.alignment,
        cloning=caps.cloning,
        instructions=caps.instructions,
        languages=list(caps.languages),
        input=caps.input,
        max_concurrency=caps.max_concurrency,
        typical_first_chunk_ms=round(caps.typical_first_chunk_s * 1000, 1),
        normalizes_text=caps.normalizes_text,
        seed=caps.seed,
    )
