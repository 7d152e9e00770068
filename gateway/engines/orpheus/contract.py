"""The orpheus engine's part of the contract suite
(``gateway.engines.contract``): it needs a real vLLM, so its contract runs
from ``tests_vllm/``."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.engines.contract import ContractHooks, Patch


def fail_segment(patch: Patch, marker: str) -> None:
    """The completion request for the marked segment asks for 0 tokens: the
    real vLLM refuses it (a 400), and only that segment fails."""
    from gateway.engines.orpheus.engine import OrpheusEngine

    completion_body = OrpheusEngine.completion_body

    def failing(self: OrpheusEngine, prompt: Sequence[int], text: str) -> dict[str, object]:
        body = completion_body(self, prompt, text)
        if marker in text:
            body["max_tokens"] = 0
        return body

    patch(OrpheusEngine, "completion_body", failing)


HOOKS = ContractHooks(
    fail_segment=fail_segment,
    external="tests_vllm/ (a real vLLM serving a tiny Orpheus-shaped model)",
)
