"""Whole-batch checks of ``POST /v1/audio/speech/batch`` that run before any
item is synthesized.

An item whose ``input`` is not a string (``5``, ``null``) makes the batch's
character count meaningless, so the whole batch is refused with the code the
single endpoint gives the same body: ``invalid_message`` (400), with the
item's path, as msgspec words it for a single request.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import ErrorCode, GatewayError

_JSON_NAMES = {
    type(None): "null",
    bool: "bool",
    int: "int",
    float: "float",
    list: "array",
    dict: "object",
}


def check_batch_inputs(items: list[Any], defaults: dict[str, Any]) -> None:
    """Raise ``invalid_message`` for the first ``input`` that is not a string."""
    if "input" in defaults and not isinstance(defaults["input"], str):
        raise _not_a_string(defaults["input"], "$.input", "input")
    for index, item in enumerate(items):
        if isinstance(item, dict) and "input" in item and not isinstance(item["input"], str):
            raise _not_a_string(item["input"], f"$.items[{index}].input", "items")


def _not_a_string(value: object, path: str, param: str) -> GatewayError:
    kind = _JSON_NAMES.get(type(value), type(value).__name__)
    return GatewayError(
        ErrorCode.INVALID_MESSAGE, f"Expected `str`, got `{kind}` - at `{path}`", param=param
    )
