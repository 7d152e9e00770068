"""Orpheus' emotion tags: inline markup the model was trained to act out.

Declared in the engine's capabilities (``Capabilities.markup_tags``), so the
text front-end passes them through verbatim and the segmenter keeps each one
whole with the words before it; nothing else in the gateway lists them.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EMOTION_TAGS"]

EMOTION_TAGS: Final = (
    "<laugh>",
    "<chuckle>",
    "<sigh>",
    "<cough>",
    "<sniffle>",
    "<groan>",
    "<yawn>",
    "<gasp>",
)
