"""Typed server settings and their one precedence.

Precedence, highest first: command line > environment (``GATEWAY_<FIELD>``,
upper-case field name) > configuration file (TOML) > defaults below.
Every field is documented in ``docs/configuration.md``; a test keeps that file
in step with this type.  Values are validated once, at start, and a bad value
stops the server with a message naming the field.

This module does no I/O beyond reading the file it is given.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

ENV_PREFIX = "GATEWAY_"

#: OpenAI's voice names, aliased by default to the engine's default voice
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
)


class SettingsError(ValueError):
    """A setting is missing, malformed or out of range."""


class Settings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # --- server -------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = 8000
    #: where everything the server writes lives (model cache, voices, logs)
    data_dir: str = "~/.local/share/voice-gateway"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    #: uvicorn's WebSocket implementation; ``websockets-sansio`` applies write
    #: backpressure from uvicorn 0.52.1 on, which flow control relies on.
    ws_impl: Literal["websockets-sansio", "websockets", "wsproto"] = "websockets-sansio"
    #: API keys; empty means no authentication (loopback default)
    api_keys: list[str] = []
    #: API keys of agent hosts (voice-agent servers running many calls from
    #: one address): also accepted as API keys; a connection presenting one
    #: is limited per key (``max_sessions_per_agent_key``, and
    #: ``max_connections_per_minute`` per key) instead of per address
    agent_api_keys: list[str] = []
    #: extra Origins allowed to open the WebSocket (same-origin is always allowed)
    allowed_origins: list[str] = []
    #: proxy addresses trusted for X-Forwarded-For (uvicorn's setting)
    forwarded_allow_ips: str = "127.0.0.1"
    # --- engine -------------------------------------------------------------
    #: registry name of the engine (``piper`` or ``synthetic``)
    engine: str = "piper"
    #: extra Piper voices: paths to ``.onnx`` files (``.onnx.json`` beside them)
    voices: list[str] = []
    #: torch device for the vocoder: ``auto`` picks CUDA when available
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: onnxruntime providers for acoustic models: ``auto`` adds CUDA when the
    #: ``onnxruntime-gpu`` package is installed
    onnx_provider: Literal["auto", "cpu", "cuda"] = "auto"
    #: noise scales forced to 0, thread counts and chunk sizes fixed whatever
    #: the load: identical input gives identical audio (tests)
    deterministic: bool = False
    #: decoder chunk sizes in latent frames (first, second, ... then the last
    #: value repeats): a small first chunk for latency, larger ones after
    chunk_schedule: list[int] = msgspec.field(default_factory=lambda: [16, 32, 64])
    #: threads for the acoustic model and for the vocoder (0: every core, up to
    #: 4, while the other pool is idle, one while it works)
    acoustic_threads: int = 0
    vocoder_threads: int = 0
    # --- sessions -----------------------------------------------------------
    #: ``auto`` segmentation: speak the first segment eagerly once this many
    #: words are buffered and no text arrived for ``eager_wait_ms``
    eager_min_words: int = 4
    eager_wait_ms: int = 150
    #: longest segment in characters; longer text is cut at whitespace
    max_segment_chars: int = 300
    # --- limits -------------------------------------------------------------
    max_message_bytes: int = 1_048_576
    max_input_text_bytes: int = 65_536
    max_utterance_chars: int = 20_000
    max_contexts: int = 8
    max_sessions: int = 64
    max_sessions_per_client: int = 16
    #: sessions per agent API key (``agent_api_keys``), whatever the address
    max_sessions_per_agent_key: int = 64
    #: client messages per second per session; beyond it they are dropped
    max_messages_per_second: int = 100
    #: new connections per minute per client address
    max_connections_per_minute: int = 120
    #: utterances streaming at once across the server; beyond it ``busy``
    max_active_streams: int = 16
    #: decoded but unsent audio per session before decode pauses
    max_buffered_ms: int = 2000
    config_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    stall_timeout_s: float = 10.0
    drain_timeout_s: float = 10.0
    # --- HTTP API -------------------------------------------------------------
    #: OpenAI voice names and the installed voice each speaks with
    #: (``alias=voice``; ``default`` is the engine's default voice)
    voice_aliases: list[str] = msgspec.field(
        default_factory=lambda: [f"{name}=default" for name in OPENAI_VOICES]
    )
    #: HTTP speech responses and batch items synthesizing at once; beyond it
    #: a request is refused with ``busy`` (batch items wait for a slot)
    max_http_streams: int = 8
    #: HTTP jobs are scheduled as if their audio were needed this much later
    #: than a live WebSocket stream's, so conversations are served first
    http_deadline_offset_s: float = 2.0
    max_batch_items: int = 32
    #: total ``input`` characters across a batch
    max_batch_chars: int = 50_000
    #: items of one batch synthesizing at once
    batch_concurrency: int = 4

    def __post_init__(self) -> None:
        checks: list[tuple[bool, str]] = [
            (1 <= self.port <= 65535, "port must be 1 to 65535"),
            (bool(self.chunk_schedule), "chunk_schedule must not be empty"),
            (all(c >= 1 for c in self.chunk_schedule), "chunk_schedule values must be >= 1"),
            (self.acoustic_threads >= 0, "acoustic_threads must be >= 0"),
            (self.vocoder_threads >= 0, "vocoder_threads must be >= 0"),
            (self.eager_min_words >= 1, "eager_min_words must be >= 1"),
            (self.eager_wait_ms >= 0, "eager_wait_ms must be >= 0"),
            (self.max_segment_chars >= 20, "max_segment_chars must be >= 20"),
            (self.max_message_bytes >= 1024, "max_message_bytes must be >= 1024"),
            (self.max_input_text_bytes >= 1, "max_input_text_bytes must be >= 1"),
            (self.max_utterance_chars >= 1, "max_utterance_chars must be >= 1"),
            (self.max_contexts >= 1, "max_contexts must be >= 1"),
            (self.max_sessions >= 1, "max_sessions must be >= 1"),
            (self.max_sessions_per_client >= 1, "max_sessions_per_client must be >= 1"),
            (self.max_sessions_per_agent_key >= 1, "max_sessions_per_agent_key must be >= 1"),
            (self.max_active_streams >= 1, "max_active_streams must be >= 1"),
            (self.max_messages_per_second >= 1, "max_messages_per_second must be >= 1"),
            (self.max_connections_per_minute >= 1, "max_connections_per_minute must be >= 1"),
            (self.max_buffered_ms >= 100, "max_buffered_ms must be >= 100"),
            (self.config_timeout_s > 0, "config_timeout_s must be > 0"),
            (self.idle_timeout_s > 0, "idle_timeout_s must be > 0"),
            (self.stall_timeout_s > 0, "stall_timeout_s must be > 0"),
            (self.drain_timeout_s >= 0, "drain_timeout_s must be >= 0"),
            (all("=" in a for a in self.voice_aliases), "voice_aliases entries are alias=voice"),
            (self.max_http_streams >= 1, "max_http_streams must be >= 1"),
            (self.http_deadline_offset_s >= 0, "http_deadline_offset_s must be >= 0"),
            (self.max_batch_items >= 1, "max_batch_items must be >= 1"),
            (self.max_batch_chars >= 1, "max_batch_chars must be >= 1"),
            (self.batch_concurrency >= 1, "batch_concurrency must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise SettingsError(message)

    @property
    def accepted_keys(self) -> list[str]:
        """Every API key the server accepts: ``api_keys`` and ``agent_api_keys``."""
        return [*self.api_keys, *self.agent_api_keys]

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def alias_table(self) -> dict[str, str]:
        """``voice_aliases`` as a dict: casefolded alias -> voice name."""
        table: dict[str, str] = {}
        for entry in self.voice_aliases:
            alias, _, voice = entry.partition("=")
            table[alias.strip().casefold()] = voice.strip()
        return table


def field_names() -> list[str]:
    return list(Settings.__struct_fields__)


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """Read ``GATEWAY_<FIELD>`` variables.  Lists are comma-separated."""
    values: dict[str, Any] = {}
    info = {f.name: f for f in msgspec.structs.fields(Settings)}
    for name, fld in info.items():
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        if "list" in repr(fld.type):
            values[name] = [item.strip() for item in raw.split(",") if item.strip()]
        else:
            values[name] = raw
    return values


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Merge defaults < file < environment < overrides and validate."""
    merged: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            merged.update(tomllib.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise SettingsError(f"configuration file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"configuration file {path} is not valid TOML: {exc}") from None
    env_values = _from_env(os.environ if environ is None else environ)
    merged.update(env_values)
    if overrides:
        merged.update({k: v for k, v in overrides.items() if v is not None})
    try:
        # strict=False lets environment strings become ints, floats and bools
        return msgspec.convert(merged, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"invalid setting: {exc}") from None
    except SettingsError:
        raise
