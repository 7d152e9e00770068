"""The built-in engines' settings sections: one field each, named after its
engine and typed with the engine's ``section.Section``
(``gateway/engines/<engine>/settings.py``).

``gateway.settings.Settings`` inherits these fields and reads every section
alike (``SECTIONS``: its fields typed with a ``Section``).  Adding an
engine's section is its Struct beside the engine and one field here.
"""

from __future__ import annotations

import msgspec

from gateway.engines.orpheus.settings import OrpheusSettings
from gateway.engines.piper.settings import PiperSettings
from gateway.engines.upstream.settings import UpstreamSettings


class EngineSections(msgspec.Struct, kw_only=True):
    #: ``[piper]``: the Piper engine
    piper: PiperSettings = msgspec.field(default_factory=PiperSettings)
    #: ``[upstream]``: the ``upstream`` engine's replica pool
    upstream: UpstreamSettings = msgspec.field(default_factory=UpstreamSettings)
    #: ``[orpheus]``: the ``orpheus`` engine (vLLM pool, tokenizer, SNAC)
    orpheus: OrpheusSettings = msgspec.field(default_factory=OrpheusSettings)
