"""Settings: precedence, validation, and the docs kept in step."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from gateway.settings import (
    DEPRECATED_ALIASES,
    SECTIONS,
    SettingsError,
    field_names,
    load_settings,
)

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
        ({"GATEWAY_PIPER_CHUNK_SCHEDULE": ""}, "chunk_schedule"),
        ({"GATEWAY_PIPER_DEVICE": "gpu"}, r"\$\.piper\.device"),
        ({"GATEWAY_PIPER_VOCODER_THREADS": "-1"}, "piper.vocoder_threads"),
        ({"GATEWAY_PIPER_DEVISE": "cpu"}, "GATEWAY_PIPER_DEVISE.*GATEWAY_PIPER_DEVICE"),
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
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", doc, re.MULTILINE))
    assert documented == set(field_names())
    assert "piper.device" in documented  # sections are listed field by field


def test_default_config_file_loads() -> None:
    settings = load_settings(ROOT / "configs" / "default.toml", environ={})
    assert settings.host == "127.0.0.1" and settings.port == 8000


def test_sections_read_from_file_and_environment(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text('[piper]\ndevice = "cpu"\nchunk_schedule = [8, 16]\n')
    env = {"GATEWAY_PIPER_VOCODER_THREADS": "2", "GATEWAY_PIPER_VOICES": "/a.onnx, /b.onnx"}
    settings = load_settings(config, environ=env)
    assert settings.piper.device == "cpu" and settings.piper.chunk_schedule == [8, 16]
    assert settings.piper.vocoder_threads == 2
    assert settings.piper.voices == ["/a.onnx", "/b.onnx"]
    # the environment wins field by field, the rest of the section stays
    settings = load_settings(config, environ={"GATEWAY_PIPER_DEVICE": "cuda"})
    assert settings.piper.device == "cuda" and settings.piper.chunk_schedule == [8, 16]


def test_unknown_section_field_in_file_is_rejected(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text('[piper]\ndevise = "cpu"\n')
    with pytest.raises(SettingsError, match="devise"):
        load_settings(config, environ={})


def test_no_top_level_field_looks_like_a_section_variable() -> None:
    """GATEWAY_<SECTION>_... must name a section field, never a top-level one."""
    assert all("_" not in section for section in SECTIONS)
    top = [name for name in field_names() if "." not in name]
    assert not [n for n in top if any(n.startswith(f"{s}_") for s in SECTIONS)]


@pytest.mark.parametrize(
    "old", sorted(old for old, (section, _) in DEPRECATED_ALIASES.items() if section)
)
def test_deprecated_flat_names_still_work_with_a_warning(
    old: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    section, name = DEPRECATED_ALIASES[old]
    assert section is not None
    value = {
        "voices": ["/x.onnx"],
        "device": "cpu",
        "onnx_provider": "cpu",
        "deterministic": True,
        "chunk_schedule": [8],
        "acoustic_threads": 3,
        "vocoder_threads": 3,
    }[old]
    env_raw = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    with caplog.at_level(logging.WARNING, logger="gateway.settings"):
        from_env = load_settings(environ={f"GATEWAY_{old.upper()}": env_raw})
    assert getattr(getattr(from_env, section), name) == value
    assert f"GATEWAY_{old.upper()} is deprecated" in caplog.text
    assert f"GATEWAY_{section.upper()}_{name.upper()}" in caplog.text
    caplog.clear()
    config = tmp_path / "gw.toml"
    toml_value = str(value).lower() if isinstance(value, bool) else repr(value)
    config.write_text(f"{old} = {toml_value}\n".replace("'", '"'))
    with caplog.at_level(logging.WARNING, logger="gateway.settings"):
        from_file = load_settings(config, environ={})
    assert getattr(getattr(from_file, section), name) == value
    assert "deprecated" in caplog.text and f"[{section}] {name}" in caplog.text


def test_deprecated_name_and_new_name_together_fail_naming_both(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"GATEWAY_DEVICE.*GATEWAY_PIPER_DEVICE"):
        load_settings(environ={"GATEWAY_DEVICE": "cpu", "GATEWAY_PIPER_DEVICE": "cuda"})
    config = tmp_path / "gw.toml"
    config.write_text('device = "cpu"\n[piper]\ndevice = "cuda"\n')
    with pytest.raises(SettingsError, match=r"device.*piper"):
        load_settings(config, environ={})


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


def test_settings_name_no_engine() -> None:
    """Engine settings live with their engine (``gateway.engines.section``):
    ``gateway/settings.py`` imports no engine's package and compares the
    selected engine with no engine's name."""
    import ast

    from gateway.engines.registry import ENGINES

    tree = ast.parse((ROOT / "gateway" / "settings.py").read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if any(m.startswith(f"gateway.engines.{e}") for e in ENGINES)]
    compared = {
        c.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        for c in (node.left, *node.comparators)
        if isinstance(c, ast.Constant)
    }
    assert not compared & set(ENGINES)


def test_the_selected_engine_section_checks_what_it_needs() -> None:
    with pytest.raises(SettingsError, match=r"engine upstream needs upstream\.urls"):
        load_settings(environ={"GATEWAY_ENGINE": "upstream"})
    with pytest.raises(SettingsError, match=r"orpheus\.urls, the vLLM servers"):
        load_settings(environ={"GATEWAY_ENGINE": "orpheus"})
    # a section not selected is checked field by field, but needs nothing more
    assert load_settings(environ={"GATEWAY_ENGINE": "synthetic"}).upstream.urls == []
