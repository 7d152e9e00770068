"""The one estimate of how long a text takes to speak, before an engine knows.

Everything that plans with text length (the segmentation policy's listener
buffer, the audio stream's deadlines) asks this module, with the text the
engine will read (the front-end's spoken form, ``gateway.text.frontend``),
so URLs and Markdown the listener never hears do not count.  Pure.
"""

from __future__ import annotations

#: speech length per character of text (English at speed 1 is about 0.06 s)
SECONDS_PER_CHAR = 0.06


def estimate_seconds(text: str, speed: float) -> float:
    """Seconds of speech ``text`` is expected to give at ``speed``."""
    return len(text) * SECONDS_PER_CHAR / speed
