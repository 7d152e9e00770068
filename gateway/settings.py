"""Typed server settings and their one precedence.

Precedence, highest first: command line > environment (``GATEWAY_<FIELD>``,
upper-case field name) > configuration file (TOML) > defaults below.
Every field is documented in ``docs/configuration.md``; a test keeps that file
in step with this type.  Values are validated once, at start, and a bad value
stops the server with a message naming the field.

Engine settings live in sections: TOML ``[piper]``, environment
``GATEWAY_PIPER_<FIELD>``.  A section is one ``msgspec.Struct`` and one field
of ``Settings`` typed with it (``SECTIONS`` is derived from those fields);
section names have no underscore, so the first word after ``GATEWAY_`` names
the section.  Piper's fields used to be flat (``device``, ``GATEWAY_DEVICE``);
those names still work as deprecated aliases (``DEPRECATED_ALIASES``), with a
warning at start, and fail when the section sets the same field.

This module does no I/O beyond reading the file it is given.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit, urlunsplit

import msgspec

from gateway.engines.orpheus.tokens import VOICES as ORPHEUS_VOICES

log = logging.getLogger(__name__)

ENV_PREFIX = "GATEWAY_"

#: settings that went away with no replacement: name -> what to do instead
REMOVED_SETTINGS: dict[str, str] = {
    "eager_wait_ms": (
        "it has no effect: `auto` segmentation no longer waits for a pause but cuts"
        " when the listener's buffer needs it (docs/segmentation.md); tune"
        " `first_segment_min_words` instead, and remove it"
    ),
}

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


class PiperSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[piper]``: the Piper engine (``GATEWAY_PIPER_<FIELD>``)."""

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

    def __post_init__(self) -> None:
        _check(
            [
                (bool(self.chunk_schedule), "piper.chunk_schedule must not be empty"),
                (
                    all(c >= 1 for c in self.chunk_schedule),
                    "piper.chunk_schedule values must be >= 1",
                ),
                (self.acoustic_threads >= 0, "piper.acoustic_threads must be >= 0"),
                (self.vocoder_threads >= 0, "piper.vocoder_threads must be >= 0"),
            ]
        )


def _check(checks: list[tuple[bool, str]]) -> None:
    for ok, message in checks:
        if not ok:
            raise SettingsError(message)


class PoolSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A replica pool's fields, shared by the engines that speak to a pool of
    HTTP servers (``[upstream]``, ``[orpheus]``): each section is a subclass,
    so its fields are these plus its own, and the pool, its probes and its
    metrics (``gateway/engines/upstream/``) read them alike.  Not a section
    itself."""

    #: the section's name, for messages (``upstream.urls ...``)
    SECTION: ClassVar[str] = "upstream"

    #: base URLs of the replicas (``http://host:8000``), one model per pool
    urls: list[str] = []
    #: sent as ``Authorization: Bearer``; never logged
    api_key: str = ""
    #: the upstream's model name, sent as ``model`` ("" leaves it out)
    model: str = ""
    #: liveness probe path ("" turns active probes off: passive ejection only)
    health_path: str = "/health"
    #: readiness: the first of these answering 2xx makes a replica ready
    ready_paths: list[str] = msgspec.field(
        default_factory=lambda: ["/v1/models", "/v1/audio/voices"]
    )
    probe_interval_s: float = 2.0
    probe_timeout_s: float = 2.0
    connect_timeout_s: float = 2.0
    #: request sent to first audio byte, per attempt
    first_byte_timeout_s: float = 10.0
    #: longest silence between two pieces of a body
    read_timeout_s: float = 10.0
    #: requests (prefetched ones included) one replica serves at once
    max_per_replica: int = 8
    #: replicas tried for one segment before its first audio byte
    max_attempts: int = 3
    #: how long a segment waits for a replica below its cap
    queue_timeout_s: float = 5.0
    failure_threshold: int = 3
    cooldown_s: float = 5.0

    def __post_init__(self) -> None:
        name = self.SECTION
        _check(
            [
                (
                    not self.health_path or self.health_path.startswith("/"),
                    f"{name}.health_path must start with / (or be empty)",
                ),
                (
                    all(p.startswith("/") for p in self.ready_paths),
                    f"{name}.ready_paths must start with /",
                ),
                (self.probe_interval_s > 0, f"{name}.probe_interval_s must be > 0"),
                (self.probe_timeout_s > 0, f"{name}.probe_timeout_s must be > 0"),
                (self.connect_timeout_s > 0, f"{name}.connect_timeout_s must be > 0"),
                (self.first_byte_timeout_s > 0, f"{name}.first_byte_timeout_s must be > 0"),
                (self.read_timeout_s > 0, f"{name}.read_timeout_s must be > 0"),
                (self.max_per_replica >= 1, f"{name}.max_per_replica must be >= 1"),
                (self.max_attempts >= 1, f"{name}.max_attempts must be >= 1"),
                (self.queue_timeout_s >= 0, f"{name}.queue_timeout_s must be >= 0"),
                (self.failure_threshold >= 1, f"{name}.failure_threshold must be >= 1"),
                (self.cooldown_s >= 0, f"{name}.cooldown_s must be >= 0"),
            ]
        )
        for url in self.urls:
            check_url(url, name)


class UpstreamSettings(PoolSettings, forbid_unknown_fields=True, kw_only=True):
    """``[upstream]``: the ``upstream`` engine's pool of OpenAI-compatible
    speech servers (``docs/engine.md``, ``docs/deployment.md``); the pool's
    fields are ``PoolSettings``'."""

    SECTION: ClassVar[str] = "upstream"

    #: the upstream's output rate in Hz; 0: read from a WAV header at start
    native_rate: int = 0
    response_format: Literal["pcm", "wav"] = "pcm"
    stream_format: Literal["audio", "sse"] = "audio"
    #: voices to list when the upstream has no ``GET /v1/audio/voices`` (OpenAI)
    voices: list[str] = []
    #: BCP-47 tags the upstream's voices speak (first: its voices' language)
    languages: list[str] = msgspec.field(default_factory=lambda: ["en-US"])
    #: the upstream honours ``instructions`` (passed through when set)
    instructions: bool = False
    #: the upstream clones from ``ref_audio``/``ref_text`` (passed through)
    cloning: bool = False
    #: send ``language`` with each request (vllm-omni's Qwen3-TTS takes it)
    send_language: bool = False
    #: send ``sample_rate`` (the voice's native rate) so the upstream does not
    #: resample (this gateway takes it; OpenAI and vllm-omni do not)
    send_sample_rate: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(
            [
                (
                    self.native_rate == 0 or 8000 <= self.native_rate <= 192_000,
                    "upstream.native_rate must be 0 or 8000 to 192000",
                ),
                (bool(self.languages), "upstream.languages must not be empty"),
            ]
        )


class OrpheusSettings(PoolSettings, forbid_unknown_fields=True, kw_only=True):
    """``[orpheus]``: the ``orpheus`` engine (``docs/engine.md``): a pool of
    vLLM servers serving an Orpheus model (``PoolSettings``' fields), the
    local tokenizer and SNAC weights, sampling and the decoder."""

    SECTION: ClassVar[str] = "orpheus"

    #: vLLM answers ``/health`` and ``/v1/models``
    ready_paths: list[str] = msgspec.field(default_factory=lambda: ["/v1/models"])
    #: folder of the model's tokenizer (``tokenizer.json`` ...), read by
    #: ``transformers.AutoTokenizer`` offline: the model folder or a copy
    tokenizer: str = ""
    #: folder of the SNAC 24 kHz weights (``config.json``, ``pytorch_model.bin``)
    snac: str = ""
    #: where SNAC decodes
    device: Literal["cpu", "cuda"] = "cpu"
    #: SNAC's noise blocks: ``keyed`` to the sample position (production) or ``off``
    noise: Literal["keyed", "off"] = "keyed"
    #: the model's voices, default first (the prompt is ``"{voice}: {text}"``)
    voices: list[str] = msgspec.field(default_factory=lambda: list(ORPHEUS_VOICES))
    #: BCP-47 tag of the voices' language
    language: str = "en-US"
    temperature: float = 0.6
    top_p: float = 0.8
    repetition_penalty: float = 1.1
    #: sent as ``seed`` with each request when set (reproducible sampling: tests)
    seed: int | None = None
    #: ``max_tokens = max_tokens_base + ceil(chars x seconds_per_char x 7 x 24000 / 2048)``
    #: (7 tokens per 85.3 ms frame), capped at ``max_tokens_cap``: a runaway
    #: generation ends instead of speaking on
    seconds_per_char: float = 0.15
    max_tokens_base: int = 140
    max_tokens_cap: int = 8192
    #: decoded frames a segment may hold that wait for the listener's room
    #: (bounds memory for a stalled listener; the HTTP read pauses beyond it)
    max_pending_frames: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(
            [
                (bool(self.voices), "orpheus.voices must not be empty"),
                (self.temperature >= 0, "orpheus.temperature must be >= 0"),
                (0 < self.top_p <= 1, "orpheus.top_p must be in (0, 1]"),
                (self.repetition_penalty > 0, "orpheus.repetition_penalty must be > 0"),
                (self.seconds_per_char > 0, "orpheus.seconds_per_char must be > 0"),
                (self.max_tokens_base >= 7, "orpheus.max_tokens_base must be >= 7"),
                (
                    self.max_tokens_cap >= self.max_tokens_base,
                    "orpheus.max_tokens_cap must be >= max_tokens_base",
                ),
                (self.max_pending_frames >= 1, "orpheus.max_pending_frames must be >= 1"),
            ]
        )


def check_url(url: str, section: str = "upstream") -> None:
    """A replica's base URL: http(s), a host, no query; the message never
    repeats credentials."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise SettingsError(
            f"{section}.urls: {redact_url(url)!r} is not an http(s)://host[:port][/path] URL"
        )


def redact_url(url: str) -> str:
    """``url`` without user, password, query or fragment (logs, metric labels)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


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
    #: Host names the API answers to, besides the loopback names (``localhost``,
    #: ``127.0.0.1``, ``[::1]``) and the ``host`` address itself; any port.  A
    #: leading dot matches subdomains; ``*`` turns the check off.  Bound to all
    #: interfaces with none listed, any Host is accepted (with a warning).
    allowed_hosts: list[str] = []
    #: proxy addresses trusted for X-Forwarded-For (uvicorn's setting, comma
    #: separated); empty: trust no proxy, every limit counts the peer address
    forwarded_allow_ips: str = ""
    # --- engine -------------------------------------------------------------
    #: registry name of the engine (``piper``, ``synthetic`` or one registered
    #: through the ``voice_gateway.engines`` entry-point group)
    engine: str = "piper"
    # --- engine sections: one Struct-typed field each (see ``SECTIONS``) -----
    piper: PiperSettings = msgspec.field(default_factory=PiperSettings)
    #: ``[upstream]``: the ``upstream`` engine's replica pool
    upstream: UpstreamSettings = msgspec.field(default_factory=UpstreamSettings)
    #: ``[orpheus]``: the ``orpheus`` engine (vLLM pool, tokenizer, SNAC)
    orpheus: OrpheusSettings = msgspec.field(default_factory=OrpheusSettings)
    # --- sessions -----------------------------------------------------------
    #: ``auto`` segmentation (docs/segmentation.md): words of a steady stream
    #: before the first segment of an utterance may be cut at a word boundary
    first_segment_min_words: int = 4
    #: words a later segment needs when the listener's buffer forces a cut
    #: below clause level
    phrase_min_words: int = 4
    #: longest segment in characters; longer text is cut at whitespace
    max_segment_chars: int = 300
    #: a pronunciation lexicon for every session and request: one
    #: ``written<TAB>spoken`` entry a line (``docs/text.md``); "" none
    lexicon_file: str = ""
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
    #: of those, the most one WebSocket session may hold at once (a slot is
    #: held only while committed text is synthesized or queued)
    max_streams_per_session: int = 4
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
    #: a request is refused with ``busy`` (batch items wait for a slot).  A
    #: response whose client stops reading is abandoned after
    #: ``stall_timeout_s``, like a WebSocket
    max_http_streams: int = 8
    #: HTTP jobs are scheduled as if their audio were needed this much later
    #: than a live WebSocket stream's, so conversations are served first
    http_deadline_offset_s: float = 2.0
    max_batch_items: int = 32
    #: total ``input`` characters across a batch
    max_batch_chars: int = 50_000
    #: items of one batch synthesizing at once
    batch_concurrency: int = 4
    #: HTTP API requests per minute per client address; beyond it ``rate_limited``
    max_http_requests_per_minute: int = 1200
    #: HTTP API requests in progress at once per client address
    max_http_requests_per_client: int = 16
    #: parts of a ``multipart/form-data`` voice upload
    max_form_parts: int = 16

    def __post_init__(self) -> None:
        checks: list[tuple[bool, str]] = [
            (1 <= self.port <= 65535, "port must be 1 to 65535"),
            (self.first_segment_min_words >= 1, "first_segment_min_words must be >= 1"),
            (self.phrase_min_words >= 1, "phrase_min_words must be >= 1"),
            (self.max_segment_chars >= 20, "max_segment_chars must be >= 20"),
            (self.max_message_bytes >= 1024, "max_message_bytes must be >= 1024"),
            (self.max_input_text_bytes >= 1, "max_input_text_bytes must be >= 1"),
            (self.max_utterance_chars >= 1, "max_utterance_chars must be >= 1"),
            (self.max_contexts >= 1, "max_contexts must be >= 1"),
            (self.max_sessions >= 1, "max_sessions must be >= 1"),
            (self.max_sessions_per_client >= 1, "max_sessions_per_client must be >= 1"),
            (self.max_sessions_per_agent_key >= 1, "max_sessions_per_agent_key must be >= 1"),
            (self.max_active_streams >= 1, "max_active_streams must be >= 1"),
            (self.max_streams_per_session >= 1, "max_streams_per_session must be >= 1"),
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
            (
                self.max_http_requests_per_minute >= 1,
                "max_http_requests_per_minute must be >= 1",
            ),
            (
                self.max_http_requests_per_client >= 1,
                "max_http_requests_per_client must be >= 1",
            ),
            (self.max_form_parts >= 2, "max_form_parts must be >= 2"),
            (
                self.engine != "upstream" or bool(self.upstream.urls),
                "engine upstream needs upstream.urls (GATEWAY_UPSTREAM_URLS=http://a:8000,...)",
            ),
            (
                self.engine != "orpheus" or bool(self.orpheus.urls),
                "engine orpheus needs orpheus.urls, the vLLM servers"
                " (GATEWAY_ORPHEUS_URLS=http://a:8000,...)",
            ),
        ]
        _check(checks)

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


#: engine sections: the ``Settings`` fields typed with a section Struct.
#: Adding a section is one Struct and one such field.
SECTIONS: dict[str, type[msgspec.Struct]] = {
    f.name: f.type
    for f in msgspec.structs.fields(Settings)
    if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct)
}

#: deprecated flat names -> (section, field); they still work, with a warning
#: deprecated name -> (section or None for a top-level field, new name)
DEPRECATED_ALIASES: dict[str, tuple[str | None, str]] = {
    "eager_min_words": (None, "first_segment_min_words"),
} | {
    name: ("piper", name)
    for name in (
        "voices",
        "device",
        "onnx_provider",
        "deterministic",
        "chunk_schedule",
        "acoustic_threads",
        "vocoder_threads",
    )
}


def field_names() -> list[str]:
    """Every setting's name: top-level fields, and ``section.field``."""
    names: list[str] = []
    for name in Settings.__struct_fields__:
        section = SECTIONS.get(name)
        if section is None:
            names.append(name)
        else:
            names.extend(f"{name}.{f}" for f in section.__struct_fields__)
    return names


def env_name(name: str) -> str:
    """The environment variable of a setting (``piper.device`` ->
    ``GATEWAY_PIPER_DEVICE``)."""
    return ENV_PREFIX + name.replace(".", "_").upper()


def _env_value(fld: msgspec.structs.FieldInfo, raw: str) -> Any:
    if "list" in repr(fld.type):
        return [item.strip() for item in raw.split(",") if item.strip()]
    return raw


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """Read ``GATEWAY_<FIELD>`` and ``GATEWAY_<SECTION>_<FIELD>`` variables.
    Lists are comma-separated.  An unknown variable of a section fails."""
    values: dict[str, Any] = {}
    for fld in msgspec.structs.fields(Settings):
        if fld.name in SECTIONS:
            continue
        raw = environ.get(ENV_PREFIX + fld.name.upper())
        if raw is not None:
            values[fld.name] = _env_value(fld, raw)
    for section, struct in SECTIONS.items():
        prefix = f"{ENV_PREFIX}{section.upper()}_"
        fields = {f.name: f for f in msgspec.structs.fields(struct)}
        found: dict[str, Any] = {}
        for key, raw in environ.items():
            if not key.startswith(prefix):
                continue
            name = key[len(prefix) :].lower()
            if name not in fields:
                known = ", ".join(env_name(f"{section}.{f}") for f in fields)
                raise SettingsError(f"unknown setting {key}; [{section}] has {known}")
            found[name] = _env_value(fields[name], raw)
        if found:
            values[section] = found
    return values


def _merge(into: dict[str, Any], values: Mapping[str, Any]) -> None:
    """Later sources win field by field, inside sections too."""
    for key, value in values.items():
        if key in SECTIONS and isinstance(value, Mapping) and isinstance(into.get(key), dict):
            into[key] = {**into[key], **value}
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def _resolve_aliases(merged: dict[str, Any], origin: dict[str, str]) -> None:
    """Move deprecated names to their replacement (in a section, or a
    top-level field) with a warning, and drop removed ones with a warning;
    fail when the replacement is set in the same source too (which one was
    meant?)."""
    for old, (section, name) in DEPRECATED_ALIASES.items():
        if old not in merged:
            continue
        value = merged.pop(old)
        dotted = name if section is None else f"{section}.{name}"
        new = f"{name if section is None else f'[{section}] {name}'} ({env_name(dotted)})"
        target = merged if section is None else merged.setdefault(section, {})
        if not isinstance(target, dict):
            continue  # a malformed section: msgspec names it below
        if name in target:
            raise SettingsError(
                f"{origin.get(old, old)} is a deprecated name of {new}, and both are set;"
                " keep only the new one"
            )
        log.warning("setting %s is deprecated; use %s", origin.get(old, old), new)
        target[name] = value
    for old, advice in REMOVED_SETTINGS.items():
        if old in merged:
            merged.pop(old)
            log.warning("setting %s is deprecated: %s", origin.get(old, old), advice)


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Merge defaults < file < environment < overrides and validate."""
    merged: dict[str, Any] = {}
    #: where each deprecated flat name came from, for the messages
    origin: dict[str, str] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            from_file = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SettingsError(f"configuration file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"configuration file {path} is not valid TOML: {exc}") from None
        origin.update({k: f"{k!r} in {path.name}" for k in from_file if k in _OLD_NAMES})
        _merge_layer(merged, from_file, origin)
    env = os.environ if environ is None else environ
    flat_env = {
        old: env[ENV_PREFIX + old.upper()] for old in _OLD_NAMES if ENV_PREFIX + old.upper() in env
    }
    env_values = _from_env(env)
    for old, raw in flat_env.items():
        origin[old] = ENV_PREFIX + old.upper()
        if old in REMOVED_SETTINGS:
            env_values[old] = raw
            continue
        section, name = DEPRECATED_ALIASES[old]
        owner = Settings if section is None else SECTIONS[section]
        fld = next(f for f in msgspec.structs.fields(owner) if f.name == name)
        env_values[old] = _env_value(fld, raw)
    _merge_layer(merged, env_values, origin)
    if overrides:
        _merge_layer(merged, {k: v for k, v in overrides.items() if v is not None}, origin)
    try:
        # strict=False lets environment strings become ints, floats and bools
        return msgspec.convert(merged, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"invalid setting: {exc}") from None
    except SettingsError:
        raise


_OLD_NAMES = (*DEPRECATED_ALIASES, *REMOVED_SETTINGS)


def _merge_layer(merged: dict[str, Any], layer: dict[str, Any], origin: dict[str, str]) -> None:
    """Merge one source over the lower ones: its deprecated flat names are
    resolved against its own section values first, then override."""
    layer = dict(layer)
    _resolve_aliases(layer, origin)
    _merge(merged, layer)
