"""What an agent plugin reads from ``session.created`` and the ``session.config`` it sends.

Pure, no I/O.  The reference is the gateway's ``docs/protocol.md``.
"""

from __future__ import annotations

from typing import Any

#: the protocol major versions this package speaks.  2.0.0 changed only what
#: ``session.close`` means (it finishes what was flushed before the close);
#: the plugins never send it: they stop by closing the socket, which stops
#: the gateway's work at once under both, and barge in with ``cancel``
PROTOCOL_MAJORS = (1, 2)
#: the newest of them
PROTOCOL_MAJOR = PROTOCOL_MAJORS[-1]
#: frames sent by the gateway; 20 ms is its recommended low-latency frame
FRAME_MS = 20


class ProtocolMismatch(Exception):
    """The server speaks a protocol version this plugin cannot use."""


def check_protocol_version(created: dict[str, Any]) -> str:
    """The server's ``protocol_version``, or ``ProtocolMismatch`` when its
    major version is not one this plugin speaks."""
    version = str(created.get("protocol_version", ""))
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) not in PROTOCOL_MAJORS:
        spoken = " or ".join(f"{m}.x" for m in PROTOCOL_MAJORS)
        raise ProtocolMismatch(
            f"the gateway speaks protocol {version or 'unknown'}; this plugin speaks"
            f" {spoken}: upgrade the plugin or the gateway"
        )
    return version


def engine_gives_word_timings(created: dict[str, Any]) -> bool:
    """Whether the gateway's engine sends word timings (``alignment`` events).

    Read from ``session.created.capabilities.alignment`` (protocol 1.1.0);
    a 1.0.0 server declares nothing,
    and every engine it ships (Piper, synthetic) aligns, so the answer then
    is ``True``.
    """
    capabilities = created.get("capabilities")
    if isinstance(capabilities, dict):
        value = capabilities.get("alignment")
        if isinstance(value, bool):
            return value
    return True


def native_rate(created: dict[str, Any], voice: str | None) -> int | None:
    """The native sample rate of ``voice`` (the server's default when None)."""
    voices = created.get("voices") or []
    for entry in voices:
        if voice is None or str(entry.get("name", "")).casefold() == voice.strip().casefold():
            rate = entry.get("sample_rate")
            return int(rate) if isinstance(rate, int) else None
    return None


def resolve_language(
    requested: str | None, created: dict[str, Any], voice: str | None
) -> str | None:
    """A bare language subtag (``en``, as Pipecat's ``Language.EN`` or
    LiveKit's ``LanguageCode`` gives it) names the voice's own language when
    the voice speaks it (``en-US``): the gateway accepts only the voice's own
    tag, code or name (or ``Auto``).  Anything else is sent as it is, and a
    language the voice does not speak is refused by the gateway."""
    if requested is None:
        return None
    tag = requested.strip().replace("_", "-")
    if "-" in tag or tag.casefold() == "auto":
        return requested
    for entry in created.get("voices") or []:
        if voice is None or str(entry.get("name", "")).casefold() == voice.strip().casefold():
            own = str(entry.get("language", ""))
            if own.split("-", 1)[0].casefold() == tag.casefold():
                return own
            break
    return requested


def session_config(
    *,
    sample_rate: int,
    voice: str | None,
    speed: float | None,
    language: str | None,
    timestamps: bool,
    max_lead_ms: int | None = None,
) -> dict[str, Any]:
    """The ``session.config`` an agent plugin sends: PCM s16le frames at the
    pipeline's rate, tagged framing (contexts interleave), ``realtime`` flow
    control (a plugin never sees playback, so it cannot ``ack``, and ``none``
    would count all sent audio as heard on a cancel)."""
    config: dict[str, Any] = {
        "type": "session.config",
        "response_format": "pcm",
        "encoding": "pcm_s16le",
        "stream_audio": True,
        "frame_ms": FRAME_MS,
        "sample_rate": sample_rate,
        "framing": "tagged",
        "flow_control": "realtime",
        "timestamps": timestamps,
    }
    if voice is not None:
        config["voice"] = voice
    if speed is not None:
        config["speed"] = speed
    if language is not None:
        config["language"] = language
    if max_lead_ms is not None:
        config["max_lead_ms"] = max_lead_ms
    return config
