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
