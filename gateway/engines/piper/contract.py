"""The Piper engine's part of the contract suite (``gateway.engines.contract``)."""

from __future__ import annotations

from gateway.engines.contract import ContractHooks, Patch


def fail_segment(patch: Patch, marker: str) -> None:
    """Piper's phonemizer (espeak, the first model call) fails for the marker."""
    from gateway.engines.piper.voice import LoadedVoice

    phonemize = LoadedVoice.phonemize

    def failing(self: LoadedVoice, text: str) -> list[str]:
        if marker in text:
            raise RuntimeError("injected phonemizer failure")
        return phonemize(self, text)

    patch(LoadedVoice, "phonemize", failing)


HOOKS = ContractHooks(fail_segment=fail_segment)
