"""The fields every replica pool has (``PoolSettings``), the base of the
remote engines' settings sections (``[upstream]``, ``[orpheus]``), and the
replicas' URLs: checked, and redacted for logs and metric labels.

This module does no I/O.
"""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import urlsplit, urlunsplit

import msgspec

from gateway.engines.section import Section, check
from gateway.errors import SettingsError


class PoolSettings(Section, forbid_unknown_fields=True, kw_only=True):
    """A replica pool's fields, shared by the engines that speak to a pool of
    HTTP servers (``[upstream]``, ``[orpheus]``): each section is a subclass,
    so its fields are these plus its own, and the pool, its probes and its
    metrics (``gateway/engines/pool/``) read them alike.  Not a section
    itself."""

    #: the section's name, for messages (``upstream.urls ...``)
    SECTION: ClassVar[str] = "upstream"
    #: what the URLs are, in the message when none is set (``, the vLLM servers``)
    URLS_ARE: ClassVar[str] = ""

    #: base URLs of the replicas (``http://host:8000``), one model per pool
    urls: list[str] = msgspec.field(default_factory=list)
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
    #: where a replica lists its voices, read on its own schedule ("": none)
    voices_path: str = "/v1/audio/voices"
    #: how often a ready replica's voice listing is read again
    voices_interval_s: float = 30.0
    probe_interval_s: float = 2.0
    probe_timeout_s: float = 2.0
    connect_timeout_s: float = 2.0
    #: request sent to first audio byte, per attempt
    first_byte_timeout_s: float = 10.0
    #: longest silence between two pieces of a body (first_byte_timeout_s
    #: instead where that is longer: one read timeout covers both waits)
    read_timeout_s: float = 10.0
    #: request sent to the end of its body, per attempt (paced delivery included)
    segment_timeout_s: float = 120.0
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
        check(
            [
                (
                    not self.health_path or self.health_path.startswith("/"),
                    f"{name}.health_path must start with / (or be empty)",
                ),
                (
                    all(p.startswith("/") for p in self.ready_paths),
                    f"{name}.ready_paths must start with /",
                ),
                (
                    not self.voices_path or self.voices_path.startswith("/"),
                    f"{name}.voices_path must start with / (or be empty)",
                ),
                (self.voices_interval_s > 0, f"{name}.voices_interval_s must be > 0"),
                (self.probe_interval_s > 0, f"{name}.probe_interval_s must be > 0"),
                (self.probe_timeout_s > 0, f"{name}.probe_timeout_s must be > 0"),
                (self.connect_timeout_s > 0, f"{name}.connect_timeout_s must be > 0"),
                (self.first_byte_timeout_s > 0, f"{name}.first_byte_timeout_s must be > 0"),
                (self.read_timeout_s > 0, f"{name}.read_timeout_s must be > 0"),
                (
                    self.segment_timeout_s >= self.first_byte_timeout_s,
                    f"{name}.segment_timeout_s must be >= first_byte_timeout_s",
                ),
                (self.max_per_replica >= 1, f"{name}.max_per_replica must be >= 1"),
                (self.max_attempts >= 1, f"{name}.max_attempts must be >= 1"),
                (self.queue_timeout_s >= 0, f"{name}.queue_timeout_s must be >= 0"),
                (self.failure_threshold >= 1, f"{name}.failure_threshold must be >= 1"),
                (self.cooldown_s >= 0, f"{name}.cooldown_s must be >= 0"),
            ]
        )
        for url in self.urls:
            check_url(url, name)

    def check_selected(self) -> None:
        if not self.urls:
            raise SettingsError(
                f"engine {self.SECTION} needs {self.SECTION}.urls{self.URLS_ARE}"
                f" (GATEWAY_{self.SECTION.upper()}_URLS=http://a:8000,...)"
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
