"""A replica's refusal as one message, whatever server answered (pure)."""

from __future__ import annotations

import pytest

from gateway.engines.pool.replicas import ERROR_BODY_BYTES, error_message, redact_text


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


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("Voice 'ghost' is not one of tone, alto.", "Voice 'ghost' is not one of tone, alto."),
        ("see http://admin:pw@10.0.0.1:9000/x?token=1 now", "see <url> now"),
        ("header Bearer abc.def-123 was refused", "header Bearer <redacted> was refused"),
        ("api_key=sk-123 and token: t0k and password=hunter2", None),
        ("key sk-live-0123456789abcdef leaked", "key <redacted> leaked"),
        ("id A1b2C3d4E5f6G7h8I9j0K1l2M3n4 here", "id <redacted> here"),
        ("x" * 40, "x" * 40),  # a long word is not a key
    ],
)
def test_a_replicas_error_text_loses_urls_and_keys(text: str, redacted: str | None) -> None:
    got = redact_text(text)
    if redacted is not None:
        assert got == redacted
    for secret in ("admin:pw", "10.0.0.1", "abc.def", "sk-", "hunter2", "t0k", "A1b2C3"):
        assert secret not in got


def test_an_error_message_is_redacted() -> None:
    body = b'{"error": {"message": "down, see http://u:p@h:1/ with api_key=k3y"}}'
    assert error_message(503, body) == "HTTP 503: down, see <url> with api_key=<redacted>"
