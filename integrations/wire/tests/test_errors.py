from __future__ import annotations

from voice_gateway_wire.errors import ERROR_STATUS, error_status


def test_a_known_code_has_its_status_and_an_unknown_one_is_500() -> None:
    assert error_status("busy") == 503
    assert error_status("rate_limited") == 429
    assert error_status("host_not_allowed") == 403
    assert error_status("a_code_from_a_newer_gateway") == 500
    assert error_status(None) == 500
    assert all(400 <= status < 600 for status in ERROR_STATUS.values())
