"""Typed server settings and their one precedence.

Precedence, highest first: command line > environment (``GATEWAY_<FIELD>``,
upper-case field name) > configuration file (TOML) > defaults below.
Every field is documented in ``docs/configuration.md``; a test keeps that file
in step with this type.  Values are validated once, at start, and a bad value
stops the server with a message naming the field.

Engine settings live with their engine, in sections: TOML ``[piper]``,
environment ``GATEWAY_PIPER_<FIELD>``.  A section is one
``gateway.engines.section.Section`` Struct in the engine's package, with its
own validation, and one field of ``Settings`` typed with it (inherited from
``gateway/engines/sections.py``; ``SECTIONS`` is derived from those fields);
this module names no engine and reads every section alike.  Section names
have no underscore, so the first word after ``GATEWAY_`` names the section.
The selected engine's section checks what only it needs
(``Section.check_selected``: a pool its URLs).  A section's fields that used
to be flat (Piper's ``device``, ``GATEWAY_DEVICE``: its ``FLAT_ALIASES``)
still work as deprecated aliases (``DEPRECATED_ALIASES``), with a warning at
start, and fail when the section sets the same field.

This module does no I/O beyond reading the file it is given.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from gateway.engines.section import Section, check
from gateway.engines.sections import EngineSections
from gateway.errors import SettingsError

#: what a gateway id may be: a resume token's prefix, URL-safe, without ``.``
GATEWAY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

__all__ = ["SECTIONS", "Settings", "SettingsError", "field_names", "load_settings"]

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


class Settings(EngineSections, forbid_unknown_fields=True, kw_only=True):
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
    api_keys: list[str] = msgspec.field(default_factory=list)
    #: API keys of agent hosts (voice-agent servers running many calls from
    #: one address): also accepted as API keys; a connection presenting one
    #: is limited per key (``max_sessions_per_agent_key``, and
    #: ``max_connections_per_minute`` per key) instead of per address
    agent_api_keys: list[str] = msgspec.field(default_factory=list)
    #: extra Origins allowed to open the WebSocket (same-origin is always allowed)
    allowed_origins: list[str] = msgspec.field(default_factory=list)
    #: Host names the API answers to, besides the loopback names (``localhost``,
    #: ``127.0.0.1``, ``[::1]``) and the ``host`` address itself; any port.  A
    #: leading dot matches subdomains; ``*`` turns the check off.  Bound to all
    #: interfaces with none listed, any Host is accepted (with a warning).
    allowed_hosts: list[str] = msgspec.field(default_factory=list)
    #: proxy addresses trusted for X-Forwarded-For (uvicorn's setting, comma
    #: separated); empty: trust no proxy, every limit counts the peer address
    forwarded_allow_ips: str = ""
    #: this gateway's id: the prefix of the resume tokens it issues, which a
    #: proxy routes a ``session.resume`` by (``[A-Za-z0-9_-]``, at most 64);
    #: "" the host name (``docs/deployment.md``, "Resume on the same gateway")
    gateway_id: str = ""
    # --- engine -------------------------------------------------------------
    #: registry name of the engine (``piper``, ``synthetic`` or one registered
    #: through the ``voice_gateway.engines`` entry-point group)
    engine: str = "piper"
    # --- engine sections: inherited, one Section-typed field each
    # (``gateway/engines/sections.py``; see ``SECTIONS``) -----------------
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
    #: vllm-omni 0.30 takes a 4 MiB ``session.config`` (reference audio inside)
    max_message_bytes: int = 4_194_304
    #: any ``input.text`` vllm-omni 0.30 takes (128 Ki characters of up to 4 bytes)
    max_input_text_bytes: int = 524_288
    max_utterance_chars: int = 131_072
    #: engine text per utterance (or HTTP request) once the front-end has
    #: expanded it (aliases, numbers and symbols read out): past it the rest
    #: is refused with ``text_too_long`` (``docs/text.md``, "Bounded work");
    #: 0: three times ``max_utterance_chars`` (``engine_chars_budget``)
    max_utterance_engine_chars: int = 0
    max_contexts: int = 8
    max_sessions: int = 64
    #: sessions per client address: as many as the server holds, so one
    #: benchmark or proxy client is not capped below what it can serve
    #: (fairness among clients is the admission queue's round-robin)
    max_sessions_per_client: int = 64
    #: sessions per agent API key (``agent_api_keys``), whatever the address
    max_sessions_per_agent_key: int = 64
    #: client messages per second per session; beyond it they are dropped
    max_messages_per_second: int = 100
    #: new connections per minute per client address
    max_connections_per_minute: int = 120
    #: WebSocket sessions admitted at once (the door: a session is admitted
    #: at its first committed text and keeps its place until it ends); beyond
    #: it new sessions wait in the admission queue (docs/configuration.md,
    #: "Sizing admission").  0: automatic, sized from what conversations cost
    #: on this machine (``gateway.flow.capacity``)
    max_active_streams: int = 0
    #: utterances of one admitted session synthesized at once (all its
    #: contexts); more wait for the session's own, never refused
    max_streams_per_session: int = 4
    #: requests (sessions at the door, HTTP responses) that may wait, per
    #: surface; beyond it ``busy`` at once (0: no queue, refuse when full)
    admission_queue_length: int = 64
    #: the longest a request waits for a slot before ``busy`` (with retry
    #: advice).  5 s outlasts the automatic door's dip when many sessions
    #: start together (its cost and slack readings recover 3-3.5 s after a
    #: burst, docs/configuration.md "Sizing admission"); with 3 s the
    #: ladder's last newcomer was refused half a second before the door
    #: opened for it (docs/benchmarks.md, round 17)
    admission_deadline_s: float = 5.0
    #: under ``flow_control: "ack"``, how long audio may wait on a closed
    #: window with no ``playback`` report before the utterance is cancelled
    #: (``error`` ``listener_silent``) and its slot released
    ack_timeout_s: float = 10.0
    #: decoded but unsent audio per session before decode pauses
    max_buffered_ms: int = 2000
    config_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    stall_timeout_s: float = 10.0
    #: how long a shutdown, and a WebSocket ``session.close``, may spend
    #: finishing what was flushed before the rest is cancelled and reported
    drain_timeout_s: float = 10.0
    #: how long a WebSocket session whose connection dropped without
    #: ``session.close`` waits, suspended, for ``session.resume`` (0: never)
    resume_window_s: float = 30.0
    #: the newest bytes of what a session sent (audio payloads and event
    #: characters) held for a resume to send again, per session
    resume_retention_bytes: int = 1_048_576
    #: suspended sessions on the server; at the limit the oldest suspended
    #: session ends to make room for a newer one
    max_suspended_sessions: int = 64
    #: suspended sessions per client (address or agent key); at it the
    #: client's oldest suspended session ends
    max_suspended_sessions_per_client: int = 64
    #: replay bytes held by suspended sessions, all together; at it the
    #: oldest suspended sessions end
    max_suspended_bytes: int = 67_108_864
    #: ``session.resume`` attempts per minute per client (address or agent
    #: key), failed ones included; beyond it ``rate_limited``
    max_resumes_per_minute: int = 20
    #: after a suspended session ends unresumed, how long a resume with its
    #: token still gets the text it did not hear (``resume_expired``'s
    #: ``unspoken``; 0: never)
    resume_report_s: float = 300.0
    # --- HTTP API -------------------------------------------------------------
    #: whose defaults a speech request that does not say gets, where OpenAI
    #: and vllm-omni 0.30 disagree: ``openai`` (``mp3``, a streamed body) or
    #: ``vllm-omni`` (``wav``, one whole file); ``gateway/http/compat.py``
    http_compat: Literal["openai", "vllm-omni"] = "openai"
    #: OpenAI voice names and the installed voice each speaks with
    #: (``alias=voice``; ``default`` is the engine's default voice)
    voice_aliases: list[str] = msgspec.field(
        default_factory=lambda: [f"{name}=default" for name in OPENAI_VOICES]
    )
    #: HTTP speech responses and batch items synthesizing at once; beyond it
    #: a request waits in the admission queue (batch items wait as long as
    #: needed), refused with ``busy`` past ``admission_deadline_s``.  A
    #: response whose client stops reading is abandoned after
    #: ``stall_timeout_s``, like a WebSocket.  16: vllm-omni's serving
    #: benchmark at concurrency 16 runs without queueing (docs/configuration.md)
    max_http_streams: int = 16
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
    #: HTTP API requests in progress at once per client address (waiting for
    #: a slot included): enough for one benchmark client at concurrency 16 and more
    max_http_requests_per_client: int = 64
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
            (
                self.max_utterance_engine_chars == 0
                or self.max_utterance_engine_chars >= self.max_utterance_chars,
                "max_utterance_engine_chars must be 0 or >= max_utterance_chars",
            ),
            (self.max_contexts >= 1, "max_contexts must be >= 1"),
            (self.max_sessions >= 1, "max_sessions must be >= 1"),
            (self.max_sessions_per_client >= 1, "max_sessions_per_client must be >= 1"),
            (self.max_sessions_per_agent_key >= 1, "max_sessions_per_agent_key must be >= 1"),
            (self.max_active_streams >= 0, "max_active_streams must be >= 0 (0: automatic)"),
            (self.max_streams_per_session >= 1, "max_streams_per_session must be >= 1"),
            (self.admission_queue_length >= 0, "admission_queue_length must be >= 0"),
            (self.admission_deadline_s >= 0, "admission_deadline_s must be >= 0"),
            (self.ack_timeout_s > 0, "ack_timeout_s must be > 0"),
            (self.max_messages_per_second >= 1, "max_messages_per_second must be >= 1"),
            (self.max_connections_per_minute >= 1, "max_connections_per_minute must be >= 1"),
            (self.max_buffered_ms >= 100, "max_buffered_ms must be >= 100"),
            (self.config_timeout_s > 0, "config_timeout_s must be > 0"),
            (self.idle_timeout_s > 0, "idle_timeout_s must be > 0"),
            (self.stall_timeout_s > 0, "stall_timeout_s must be > 0"),
            (self.drain_timeout_s >= 0, "drain_timeout_s must be >= 0"),
            (self.resume_window_s >= 0, "resume_window_s must be >= 0"),
            (
                self.resume_retention_bytes >= 65536,
                "resume_retention_bytes must be >= 65536",
            ),
            (self.max_suspended_sessions >= 1, "max_suspended_sessions must be >= 1"),
            (
                self.max_suspended_sessions_per_client >= 1,
                "max_suspended_sessions_per_client must be >= 1",
            ),
            (
                self.max_suspended_bytes >= self.resume_retention_bytes,
                "max_suspended_bytes must be >= resume_retention_bytes",
            ),
            (self.max_resumes_per_minute >= 1, "max_resumes_per_minute must be >= 1"),
            (self.resume_report_s >= 0, "resume_report_s must be >= 0"),
            (
                self.gateway_id == "" or GATEWAY_ID.fullmatch(self.gateway_id) is not None,
                "gateway_id must be 1 to 64 of A-Z a-z 0-9 _ - (or empty: the host name)",
            ),
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
        ]
        check(checks)
        # the selected engine's own section checks what it needs (a pool its URLs)
        selected = getattr(self, self.engine) if self.engine in SECTIONS else None
        if isinstance(selected, Section):
            selected.check_selected()

    @property
    def accepted_keys(self) -> list[str]:
        """Every API key the server accepts: ``api_keys`` and ``agent_api_keys``."""
        return [*self.api_keys, *self.agent_api_keys]

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def engine_chars_budget(self) -> int:
        """``max_utterance_engine_chars`` in force (0: three times
        ``max_utterance_chars``: ordinary text reads about 1.1 times its
        length, numbers read out up to 9 times)."""
        return self.max_utterance_engine_chars or 3 * self.max_utterance_chars

    @property
    def alias_table(self) -> dict[str, str]:
        """``voice_aliases`` as a dict: casefolded alias -> voice name."""
        table: dict[str, str] = {}
        for entry in self.voice_aliases:
            alias, _, voice = entry.partition("=")
            table[alias.strip().casefold()] = voice.strip()
        return table


#: engine sections: the ``Settings`` fields typed with a ``Section``
#: (``gateway.engines.section``).  Adding a section is one Struct beside its
#: engine and one field in ``gateway/engines/sections.py``.
SECTIONS: dict[str, type[Section]] = {
    f.name: f.type
    for f in msgspec.structs.fields(Settings)
    if isinstance(f.type, type) and issubclass(f.type, Section)
}

#: deprecated name -> (section or None for a top-level field, new name);
#: they still work, with a warning.  A section's old flat names are its
#: ``FLAT_ALIASES``.
DEPRECATED_ALIASES: dict[str, tuple[str | None, str]] = {
    "eager_min_words": (None, "first_segment_min_words"),
} | {name: (section, name) for section, struct in SECTIONS.items() for name in struct.FLAT_ALIASES}


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
