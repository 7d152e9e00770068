"""How long a text will take to speak, before the engine knows: one estimate.

The session core (how much committed audio lies ahead of the listener), the
audio stream (the engine deadline of a prefetched segment) and the
segmentation policy (when the listener runs dry) all plan with audio that
has not been synthesized yet.  They use this one function, so that the
three agree and a better estimate (counting spoken characters, for example)
changes them together.  Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Final

#: seconds of speech per character of text: English at speed 1 is about 0.06 s
SECONDS_PER_CHAR: Final = 0.06


def estimate_seconds(text: str, speed: float = 1.0) -> float:
    """Estimated seconds of audio ``text`` makes at ``speed`` (1 = normal)."""
    return len(text) * SECONDS_PER_CHAR / speed
