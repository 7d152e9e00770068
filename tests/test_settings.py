"""Settings: precedence, validation, and the docs kept in step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.settings import SettingsError, field_names, load_settings

ROOT = Path(__file__).resolve().parent.parent


def test_precedence_cli_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text('port = 9001\nhost = "127.0.0.2"\nmax_contexts = 3\n')
    env = {"GATEWAY_PORT": "9002", "GATEWAY_API_KEYS": "a, b"}
    settings = load_settings(config, overrides={"port": 9003}, environ=env)
    assert settings.port == 9003  # command line
    assert settings.api_keys == ["a", "b"]  # environment
    assert settings.host == "127.0.0.2" and settings.max_contexts == 3  # file
    assert settings.max_sessions == 64  # default
    assert load_settings(config, environ=env).port == 9002


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"GATEWAY_PORT": "0"}, "port"),
        ({"GATEWAY_PORT": "eighty"}, "port"),
        ({"GATEWAY_WS_IMPL": "nope"}, "ws_impl"),
        ({"GATEWAY_CHUNK_SCHEDULE": ""}, "chunk_schedule"),
    ],
)
def test_invalid_values_name_the_field(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        load_settings(environ=env)


def test_unknown_file_key_is_rejected(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text("prot = 1\n")
    with pytest.raises(SettingsError, match="prot"):
        load_settings(config, environ={})


def test_configuration_doc_lists_every_field() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", doc, re.MULTILINE))
    assert documented == set(field_names())


def test_default_config_file_loads() -> None:
    settings = load_settings(ROOT / "configs" / "default.toml", environ={})
    assert settings.host == "127.0.0.1" and settings.port == 8000


def test_deprecated_eager_min_words_is_read_as_its_replacement(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "gw.toml"
    config.write_text("eager_min_words = 6\n")
    with caplog.at_level("WARNING", logger="gateway.settings"):
        settings = load_settings(config, environ={})
    assert settings.first_segment_min_words == 6
    assert "eager_min_words" in caplog.text and "first_segment_min_words" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="gateway.settings"):
        settings = load_settings(environ={"GATEWAY_EAGER_MIN_WORDS": "3"})
    assert settings.first_segment_min_words == 3
    assert "GATEWAY_EAGER_MIN_WORDS" in caplog.text
    # the new name wins when both are given
    settings = load_settings(config, overrides={"first_segment_min_words": 2}, environ={})
    assert settings.first_segment_min_words == 2


def test_deprecated_eager_wait_ms_loads_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "gw.toml"
    config.write_text("eager_wait_ms = 150\n")
    with caplog.at_level("WARNING", logger="gateway.settings"):
        settings = load_settings(config, environ={"GATEWAY_EAGER_WAIT_MS": "200"})
    assert "eager_wait_ms" in caplog.text and "GATEWAY_EAGER_WAIT_MS" in caplog.text
    assert "no effect" in caplog.text and "first_segment_min_words" in caplog.text
    assert settings == load_settings(environ={})
    with pytest.raises(SettingsError, match="first_segment_min_words"):
        load_settings(environ={"GATEWAY_EAGER_MIN_WORDS": "0"})
