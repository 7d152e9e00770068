"""The orpheus engine's set-up checks and its declared capabilities, without
a vLLM (the engine is created, not started: creating loads nothing).  The
engine end to end against a real vLLM is ``tests_vllm/``'s."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.engines.orpheus.engine import OrpheusEngine
from gateway.engines.orpheus.tokens import END_OF_SPEECH
from gateway.engines.registry import create_engine
from gateway.settings import Settings, SettingsError, load_settings

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    snac = tmp_path / "snac"
    snac.mkdir()
    (snac / "config.json").write_text("{}")
    (snac / "pytorch_model.bin").write_bytes(b"")
    return tokenizer, snac


def settings(**orpheus: object) -> Settings:
    return load_settings(
        None,
        overrides={"engine": "orpheus", "orpheus": {"urls": ["http://127.0.0.1:9"], **orpheus}},
        environ={},
    )


def test_engine_orpheus_needs_urls() -> None:
    with pytest.raises(SettingsError, match=r"orpheus\.urls"):
        load_settings(None, overrides={"engine": "orpheus"}, environ={})


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"tokenizer": ""}, r"needs orpheus\.tokenizer"),
        (
            {"tokenizer": "/nonexistent/tok"},
            r"orpheus\.tokenizer: /nonexistent/tok is not a folder",
        ),
        ({"snac": ""}, r"needs orpheus\.snac.*hubertsiuzdak/snac_24khz"),
        ({"snac": "EMPTY"}, r"orpheus\.snac: .* has no config\.json and pytorch_model\.bin"),
    ],
)
def test_missing_folders_stop_the_start_with_the_reason(
    folders: tuple[Path, Path], tmp_path: Path, change: dict[str, str], needle: str
) -> None:
    tokenizer, snac = folders
    config = {"tokenizer": str(tokenizer), "snac": str(snac), **change}
    if config["snac"] == "EMPTY":
        (tmp_path / "empty").mkdir()
        config["snac"] = str(tmp_path / "empty")
    with pytest.raises(SettingsError, match=needle):
        create_engine(settings(**config))


def test_serve_exits_2_with_the_reason(tmp_path: Path) -> None:
    env = {
        "GATEWAY_ENGINE": "orpheus",
        "GATEWAY_ORPHEUS_URLS": "http://127.0.0.1:9",
        "GATEWAY_ORPHEUS_TOKENIZER": str(tmp_path / "absent"),
        "GATEWAY_DATA_DIR": str(tmp_path / "data"),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--port", "18999"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "orpheus.tokenizer" in done.stderr and "Traceback" not in done.stderr


def test_capabilities_voices_and_requests(folders: tuple[Path, Path]) -> None:
    tokenizer, snac = folders
    engine = create_engine(
        settings(tokenizer=str(tokenizer), snac=str(snac), model="orpheus-3b", seed=7)
    )
    assert isinstance(engine, OrpheusEngine)
    caps = engine.capabilities
    assert caps.sample_rates == (24000,) and not caps.alignment and not caps.cloning
    assert not caps.instructions and caps.languages == ("en-US",)
    assert 0 < caps.typical_first_chunk_s < 1
    assert [v.name for v in engine.voices()] == [
        "tara",
        "leah",
        "jess",
        "leo",
        "dan",
        "mia",
        "zac",
        "zoe",
    ]
    assert engine.find_voice("ZOE") is not None and engine.find_voice("alloy") is None
    assert engine.model_names() == ("orpheus-3b",)
    body = engine.completion_body([1, 2, 3], "Hello there.")
    assert body["max_tokens"] == 140 + 7 * 22  # 12 characters: 1.8 s
    assert body["stop_token_ids"] == [END_OF_SPEECH] and body["seed"] == 7
    assert body["model"] == "orpheus-3b" and body["prompt"] == [1, 2, 3]
    engine.context_len = 200  # the served model's context, once a replica listed it
    assert engine.completion_body([1] * 150, "Hello there.")["max_tokens"] == 50


def test_orpheus_declares_its_item_bound_and_refuses_speed(folders: tuple[Path, Path]) -> None:
    """Bounded work per item: at most ``max_item_chars`` characters per
    completion (lowered by a short served context); and no rate control, so
    ``speed`` is not declared (a client's 1.5 is refused, not ignored)."""
    tokenizer, snac = folders
    engine = create_engine(settings(tokenizer=str(tokenizer), snac=str(snac)))
    assert isinstance(engine, OrpheusEngine)
    caps = engine.capabilities
    assert caps.max_work_item == 600 and caps.work_item_unit == "characters"
    assert caps.speed is False
    engine.context_len = 2048  # vLLM's --max-model-len 2048
    assert engine.capabilities.max_work_item == engine.item_chars == 140
    text = ", ".join(f"clause number {i} of a long sentence" for i in range(12)) + "."
    pieces = engine.work_items(text, engine.item_chars)
    assert len(pieces) > 1 and " ".join(pieces) == text
    assert all(len(piece) <= 140 for piece in pieces)
    assert all(piece.endswith((",", ".")) for piece in pieces)  # cut between clauses
    small = create_engine(settings(tokenizer=str(tokenizer), snac=str(snac), max_item_chars=50))
    assert small.capabilities.max_work_item == 50


def test_the_section_from_the_environment() -> None:
    loaded = load_settings(
        environ={
            "GATEWAY_ENGINE": "orpheus",
            "GATEWAY_ORPHEUS_URLS": "http://a:8000, http://b:8000",
            "GATEWAY_ORPHEUS_SEED": "3",
            "GATEWAY_ORPHEUS_TEMPERATURE": "0.5",
            "GATEWAY_ORPHEUS_VOICES": "tara,leo",
            "GATEWAY_ORPHEUS_MAX_PER_REPLICA": "4",
        }
    )
    config = loaded.orpheus
    assert config.urls == ["http://a:8000", "http://b:8000"] and config.seed == 3
    assert config.temperature == 0.5 and config.voices == ["tara", "leo"]
    assert config.max_per_replica == 4 and config.ready_paths == ["/v1/models"]
    assert loaded.upstream.ready_paths == ["/v1/models", "/v1/audio/voices"]  # its own default


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"GATEWAY_ORPHEUS_MAX_PER_REPLICA": "0"}, r"orpheus\.max_per_replica must be >= 1"),
        ({"GATEWAY_ORPHEUS_URLS": "ftp://x"}, r"orpheus\.urls: 'ftp://x'"),
        ({"GATEWAY_ORPHEUS_TOP_P": "0"}, r"orpheus\.top_p"),
        ({"GATEWAY_ORPHEUS_VOICES": ""}, r"orpheus\.voices must not be empty"),
        ({"GATEWAY_ORPHEUS_NOISE": "random"}, r"orpheus\.noise"),
        ({"GATEWAY_ORPHEUS_MAX_ITEM_CHARS": "49"}, r"orpheus\.max_item_chars must be >= 50"),
        ({"GATEWAY_UPSTREAM_MAX_PER_REPLICA": "0"}, r"upstream\.max_per_replica must be >= 1"),
    ],
)
def test_invalid_values_name_their_section(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        load_settings(environ=env)
