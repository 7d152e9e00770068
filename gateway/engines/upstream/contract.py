"""The upstream engine's part of the contract suite
(``gateway.engines.contract``).  The suite's own fixture starts it in front
of a real replica process (``tests/conftest.py``, ``upstream_engine``)."""

from __future__ import annotations

from typing import Any

from gateway.engines.contract import ContractHooks, Patch


def fail_segment(patch: Patch, marker: str) -> None:
    """The request for the marked segment names a voice the replica does not
    have: the real upstream refuses it (a 4xx), and only that segment fails."""
    from gateway.engines.upstream.engine import UpstreamEngine

    request_body = UpstreamEngine.request_body

    def failing(self: UpstreamEngine, *args: Any) -> dict[str, Any]:
        body = request_body(self, *args)
        if marker in body["input"]:
            body["voice"] = "no-such-voice-upstream"
        return body

    patch(UpstreamEngine, "request_body", failing)


HOOKS = ContractHooks(fail_segment=fail_segment)
