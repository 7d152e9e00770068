"""The gateway's wire protocol as this plugin uses it: pure, no I/O.

The reference is the gateway's ``docs/protocol.md``; the tagged binary
header is ``<BBHIIQ`` (version, flags, context number, utterance index,
sequence number, sample offset), 20 bytes, little-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

#: the protocol major version this plugin speaks
PROTOCOL_MAJOR = 1
TAGGED_HEADER = struct.Struct("<BBHIIQ")
TAGGED_VERSION = 1
FLAG_WAV_HEADER = 0x04
#: frames sent by the gateway; 20 ms is its recommended low-latency frame
FRAME_MS = 20

#: the gateway's error registry: code -> HTTP status (docs/protocol.md#errors),
#: so LiveKit's retry logic treats a refusal like the HTTP API's answer
ERROR_STATUS = {
    "invalid_json": 400,
    "invalid_message": 400,
    "unknown_type": 400,
    "invalid_config": 400,
    "unknown_voice": 400,
    "unsupported_option": 400,
    "invalid_state": 409,
    "text_too_long": 400,
    "message_too_large": 413,
    "unauthorized": 401,
    "origin_not_allowed": 403,
    "busy": 503,
    "rate_limited": 429,
    "timeout": 408,
    "internal": 500,
}


def error_status(code: object) -> int:
    """HTTP status of a gateway error code (500 for one this plugin does not know)."""
    return ERROR_STATUS.get(str(code), 500)


class ProtocolMismatch(Exception):
    """The server speaks a protocol version this plugin cannot use."""


@dataclass(frozen=True)
class TaggedFrame:
    context_number: int
    utterance_index: int
    sequence: int
    sample_offset: int
    is_wav_header: bool
    payload: bytes


def parse_tagged(data: bytes) -> TaggedFrame:
    """Split a tagged binary message into its header fields and payload."""
    if len(data) < TAGGED_HEADER.size:
        raise ValueError(f"binary message of {len(data)} bytes is shorter than its header")
    version, flags, number, utterance, sequence, offset = TAGGED_HEADER.unpack_from(data)
    if version != TAGGED_VERSION:
        raise ValueError(f"unknown tagged header version {version}")
    return TaggedFrame(
        context_number=number,
        utterance_index=utterance,
        sequence=sequence,
        sample_offset=offset,
        is_wav_header=bool(flags & FLAG_WAV_HEADER),
        payload=data[TAGGED_HEADER.size :],
    )


def check_protocol_version(created: dict[str, Any]) -> str:
    """The server's ``protocol_version``, or ``ProtocolMismatch`` when its
    major version is not the one this plugin speaks."""
    version = str(created.get("protocol_version", ""))
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) != PROTOCOL_MAJOR:
        raise ProtocolMismatch(
            f"the gateway speaks protocol {version or 'unknown'}; this plugin speaks"
            f" {PROTOCOL_MAJOR}.x: upgrade the plugin or the gateway"
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
