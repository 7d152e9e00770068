"""Voice management shared by the HTTP routes and the WebSocket session.

``gateway/http/voices.py`` (``/v1/audio/voices``) and ``gateway/session/core.py``
(``voice.list`` / ``voice.add`` / ``voice.remove``) call the same functions
here, so both surfaces list the same payload, validate uploads the same way
and raise the same registry errors (``GatewayError``); each surface only
maps them to its own shape (an OpenAI error body, or an ``error`` event).

Store calls (file and SQLite I/O) and audio decoding run with
``asyncio.to_thread``, never on the event loop.  An engine that keeps
copies of uploads on its servers (``upstream``) hears of each upload and
deletion (``Engine.voice_added``/``voice_removed``); when it refuses an
upload, the store drops it again.  An uploaded voice the engine speaks by
name (``VoiceInfo.uploaded``) is listed once, as uploaded.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

from gateway.engines.base import Engine, VoiceInfo
from gateway.errors import ErrorCode, GatewayError
from gateway.settings import Settings
from gateway.voices.store import MAX_TEXT_CHARS, StoredVoice, VoiceStore, check_audio, validate_name

#: ``consent`` values that mean "no"
_NO = {"", "0", "false", "no", "off"}


def alias_targets(engine: Engine, settings: Settings) -> dict[str, VoiceInfo | None]:
    """Each alias and the engine voice it names (None: not installed)."""
    out: dict[str, VoiceInfo | None] = {}
    for alias, target in settings.alias_table.items():
        if engine.find_voice(alias) is not None:
            continue  # an installed voice of that name wins over the alias
        voice = engine.find_voice(target)
        if voice is None and target.casefold() == "default":
            voice = engine.default_voice()
        out[alias] = voice
    return out


#: the name of the engine's default voice when no voice is called that
#: (vllm-omni 0.30's placeholder, as in ``{"voice": "default"}``)
DEFAULT_VOICE_NAME = "default"


def reserved_names(engine: Engine, settings: Settings) -> list[str]:
    builtin = [v.name for v in engine.voices() if not v.uploaded]
    return [*builtin, *settings.alias_table, DEFAULT_VOICE_NAME]


def can_clone(engine: Engine) -> bool:
    return engine.capabilities.cloning


def uploaded_entry(voice: StoredVoice, engine: Engine) -> dict[str, Any]:
    """An uploaded voice as listed and as answered to an upload."""
    return {**voice.public(), "type": "uploaded", "speakable": can_clone(engine)}


def omni_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """An ``uploaded_entry`` with vllm-omni 0.30's field names added:
    ``mime_type``, ``file_size``, ``embedding_source``, ``embedding_dim``,
    ``speaker_description``.  The listing's ``uploaded_voices`` and the HTTP
    upload's ``voice``."""
    return {
        **entry,
        "mime_type": entry["media_type"],
        "file_size": entry["size_bytes"],
        "embedding_source": "audio",  # the gateway stores reference audio only
        "embedding_dim": None,
        "speaker_description": entry["description"],
    }


async def voice_listing(engine: Engine, settings: Settings, store: VoiceStore) -> dict[str, Any]:
    """Built-in voices, aliases and uploaded voices (``GET /v1/audio/voices``)."""
    builtin = [
        {
            "name": v.name,
            "type": "builtin",
            "engine": v.engine or engine.name,
            "language": v.language,
            "language_name": v.language_name,
            "sample_rate": v.sample_rate,
            "quality": v.quality,
            "streaming": v.streaming,
            "description": v.description,
        }
        for v in engine.voices()
        if not v.uploaded  # listed below, from the store, as uploaded
    ]
    aliases = [
        {
            "name": alias,
            "type": "alias",
            "target": voice.name if voice is not None else settings.alias_table[alias],
            "available": voice is not None,
        }
        for alias, voice in alias_targets(engine, settings).items()
    ]
    stored = await asyncio.to_thread(store.list)
    uploaded = [uploaded_entry(v, engine) for v in stored]
    return {
        "object": "list",
        "voices": [v["name"] for v in builtin]
        + [a["name"] for a in aliases]
        + [v["name"] for v in uploaded if v["speakable"]],
        "data": builtin + aliases + uploaded,
        "uploaded_voices": [omni_entry(v) for v in uploaded],
    }


def check_consent(raw: str | bool | None) -> str:
    """The stored consent record; refuses a missing or negative one."""
    consent = raw.strip() if isinstance(raw, str) else ("true" if raw else "")
    if consent.casefold() in _NO:
        raise GatewayError(
            ErrorCode.INVALID_CONFIG,
            "`consent` is required: confirm the speaker agreed to having their voice"
            " cloned (e.g. consent=true, or a consent record id)",
            param="consent",
        )
    return consent


def check_text(label: str, value: str) -> str:
    if len(value) > MAX_TEXT_CHARS or "\x00" in value:
        raise GatewayError(
            ErrorCode.INVALID_CONFIG,
            f"`{label}` must be at most {MAX_TEXT_CHARS} characters, without NUL",
            param=label,
        )
    return value


def decode_base64_audio(text: str) -> bytes:
    """Audio sent as base64 (standard alphabet, whitespace ignored) or as a
    ``data:<type>;base64,`` URL (the declared type is ignored: content is sniffed)."""
    if text.startswith("data:"):
        head, sep, text = text.partition(",")
        if not sep or not head.endswith(";base64"):
            raise GatewayError(
                ErrorCode.INVALID_CONFIG,
                "`audio` as a data: URL must be `data:<type>;base64,<data>`",
                param="audio",
            )
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise GatewayError(
            ErrorCode.INVALID_CONFIG,
            "`audio` is not valid base64 (standard alphabet with padding, or a"
            " data:<type>;base64, URL)",
            param="audio",
        ) from None


async def add_voice(
    engine: Engine,
    settings: Settings,
    store: VoiceStore,
    *,
    name: str,
    data: bytes,
    consent: str | bool | None,
    ref_text: str = "",
    description: str = "",
) -> dict[str, Any]:
    """Validate and store an upload; returns its ``uploaded_entry`` or raises
    ``GatewayError`` (``invalid_config`` naming the field, ``invalid_state``
    for a duplicate name, ``message_too_large`` over the size limit)."""
    valid_name = validate_name(name)
    consent_record = check_consent(consent)
    check_text("ref_text", ref_text)
    check_text("description", description)
    fmt, duration, rate = await asyncio.to_thread(check_audio, data)
    voice = await asyncio.to_thread(
        store.add,
        name=valid_name,
        data=data,
        fmt=fmt,
        duration_s=duration,
        sample_rate=rate,
        consent=consent_record,
        ref_text=ref_text,
        description=description,
        reserved=reserved_names(engine, settings),
    )
    try:
        await engine.voice_added(voice, data)  # the upstream engine copies it to its replicas
    except GatewayError:
        await asyncio.to_thread(store.remove, voice.name)
        raise
    return uploaded_entry(voice, engine)


async def remove_voice(
    engine: Engine, settings: Settings, store: VoiceStore, name: str
) -> dict[str, Any]:
    """Delete an uploaded voice (case-insensitive); returns ``{name, id,
    deleted}``.  A built-in voice or alias is ``invalid_state``, an unknown
    name ``unknown_voice``."""
    own = engine.find_voice(name)
    if (own is not None and not own.uploaded) or name.strip().casefold() in settings.alias_table:
        raise GatewayError(
            ErrorCode.INVALID_STATE,
            f"{name!r} is a built-in voice or alias and cannot be deleted",
            param="name",
        )
    removed = await asyncio.to_thread(store.remove, name)
    if removed is None:
        raise GatewayError(
            ErrorCode.UNKNOWN_VOICE, f"no uploaded voice named {name!r}", param="name"
        )
    await engine.voice_removed(removed)  # the upstream engine deletes its replicas' copies
    return {"name": removed.name, "id": removed.id, "deleted": True}


async def find_speakable_voice(
    engine: Engine, settings: Settings, store: VoiceStore, raw: str
) -> VoiceInfo:
    """The engine voice to speak ``raw`` with: an engine voice by name, an
    alias (``alloy`` ...) from the settings' table, or ``GatewayError``:
    ``unsupported_option`` for an uploaded voice the engine cannot clone,
    ``unknown_voice`` (listing what is available) otherwise.  Used by the
    HTTP speech routes and by ``session.config`` alike."""
    name = raw.strip()
    voice = engine.find_voice(name)
    if voice is not None:
        return voice
    aliases = alias_targets(engine, settings)
    key = name.casefold()
    if key in aliases:
        target = aliases[key]
        if target is None:
            raise GatewayError(
                ErrorCode.UNKNOWN_VOICE,
                f"voice alias {name!r} names {settings.alias_table[key]!r}, which is not"
                f" installed; available voices: {', '.join(v.name for v in engine.voices())}",
                param="voice",
            )
        return target
    if key == DEFAULT_VOICE_NAME:
        return engine.default_voice()
    uploaded = await asyncio.to_thread(store.get, name)
    if uploaded is not None:
        if not can_clone(engine):
            raise GatewayError(
                ErrorCode.UNSUPPORTED_OPTION,
                f"voice {uploaded.name!r} is uploaded reference audio for voice cloning, and"
                f" the {engine.name!r} engine cannot clone voices; use a built-in voice",
                param="voice",
            )
        raise GatewayError(  # a cloning engine would take the reference audio here
            ErrorCode.UNSUPPORTED_OPTION,
            f"speaking with uploaded voice {uploaded.name!r} is not wired to this engine yet",
            param="voice",
        )
    listed = [v.name for v in engine.voices()] + sorted(aliases)
    others = [v.name for v in await asyncio.to_thread(store.list)]
    more = f"; uploaded (need a cloning engine): {', '.join(others)}" if others else ""
    raise GatewayError(
        ErrorCode.UNKNOWN_VOICE,
        f"unknown voice {name!r}; available voices: {', '.join(listed)}{more}",
        param="voice",
    )
