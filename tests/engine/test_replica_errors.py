"""A replica's refusal as one message, whatever server answered (pure)."""

from __future__ import annotations

import pytest

from gateway.engines.pool.replicas import ERROR_BODY_BYTES, error_message


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        # OpenAI and vLLM: {"error": {"message": ...}}
        (400, b'{"error": {"message": "bad voice", "type": "x"}}', "HTTP 400: bad voice"),
        # vllm-omni's voice API: {"success": false, "error": "..."}
        (
            404,
            b'{"success": false, "error": "Voice \'a\' not found"}',
            "HTTP 404: Voice 'a' not found",
        ),
        # FastAPI-style detail-less message
        (422, b'{"message": "too long"}', "HTTP 422: too long"),
        (503, b"", "HTTP 503"),
        (502, b"<html>bad gateway</html>", "HTTP 502"),
        (500, b"\xff\xfe not utf-8", "HTTP 500"),
        (400, b'{"error": {"message": ""}}', "HTTP 400"),
        (400, b'["not", "an", "object"]', "HTTP 400"),
        (400, b'{"error": {"message": "' + b"x" * 400 + b'"}}', "HTTP 400: " + "x" * 300),
    ],
)
def test_error_message(status: int, body: bytes, message: str) -> None:
    assert error_message(status, body) == message


def test_only_the_start_of_a_long_body_is_read() -> None:
    body = b'{"error": {"message": "late"}}'.rjust(ERROR_BODY_BYTES + 10)
    assert error_message(400, body) == "HTTP 400"  # cut JSON: just the status
