"""``/v1/audio/voices``: list, upload and delete voices; voice name lookup.

Built-in voices come from the engine, OpenAI names from the configured alias
table (``voice_aliases``), uploaded reference voices from ``VoiceStore``.
``resolve_voice`` is the one lookup the speech routes use: an engine voice,
then an alias, then an uploaded voice (which the engine must be able to
clone, else ``unsupported_option``), else ``unknown_voice`` listing them all.

Uploads are ``multipart/form-data``, parsed with the standard library's
``email`` parser (no extra dependency) after the body is read under a cap.
"""

from __future__ import annotations

import asyncio
from email.message import Message
from email.parser import BytesParser

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.engines.base import Engine, VoiceInfo
from gateway.errors import ErrorCode, GatewayError
from gateway.http_errors import check_request, error_response, gateway_state, read_body
from gateway.settings import Settings
from gateway.voice_store import (
    MAX_TEXT_CHARS,
    MAX_UPLOAD_BYTES,
    VoiceStore,
    check_audio,
    validate_name,
)

#: multipart overhead allowed on top of the audio itself
_FORM_OVERHEAD = 64 * 1024
_AUDIO_FIELDS = ("audio", "audio_sample")
_DESCRIPTION_FIELDS = ("description", "speaker_description")
_NO = {"", "0", "false", "no", "off"}


def voice_store(request: Request) -> VoiceStore:
    store: VoiceStore = request.app.state.voice_store
    return store


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


def reserved_names(engine: Engine, settings: Settings) -> list[str]:
    return [v.name for v in engine.voices()] + list(settings.alias_table)


def can_clone(engine: Engine) -> bool:
    return bool(getattr(engine, "supports_cloning", False))


async def resolve_voice(request: Request, raw: str) -> VoiceInfo:
    """The engine voice to speak ``raw`` with, or ``GatewayError``."""
    state = gateway_state(request)
    engine, settings = state.engine, state.settings
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
    store = voice_store(request)
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


# --- routes ------------------------------------------------------------------------


async def list_voices(request: Request) -> Response:
    state = gateway_state(request)
    if (refused := check_request(request)) is not None:
        return error_response(refused, state)
    engine, settings = state.engine, state.settings
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
    stored = await asyncio.to_thread(voice_store(request).list)
    uploaded = [{**v.public(), "type": "uploaded", "speakable": can_clone(engine)} for v in stored]
    return JSONResponse(
        {
            "object": "list",
            "voices": [v["name"] for v in builtin] + [a["name"] for a in aliases],
            "data": builtin + aliases + uploaded,
            "uploaded_voices": uploaded,
        }
    )


def _parse_form(content_type: str, body: bytes) -> dict[str, tuple[bytes, str | None, str]]:
    """Fields of a multipart body: name -> (bytes, filename, declared type)."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise GatewayError(
            ErrorCode.INVALID_MESSAGE,
            "upload voices as multipart/form-data (fields: audio, name, consent, ...)",
        )
    head = b"Content-Type: " + content_type.encode("latin-1") + b"\r\nMIME-Version: 1.0\r\n\r\n"
    message = BytesParser().parsebytes(head + body)
    if not message.is_multipart():
        raise GatewayError(ErrorCode.INVALID_MESSAGE, "the multipart body could not be parsed")
    fields: dict[str, tuple[bytes, str | None, str]] = {}
    parts: list[Message] = message.get_payload()  # type: ignore[assignment]
    for part in parts:
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        fields[name] = (data, part.get_filename(), part.get_content_type())
    return fields


def _text(fields: dict[str, tuple[bytes, str | None, str]], *names: str) -> str | None:
    for name in names:
        if name in fields:
            try:
                return fields[name][0].decode("utf-8")
            except UnicodeDecodeError:
                raise GatewayError(
                    ErrorCode.INVALID_CONFIG, f"`{name}` is not UTF-8 text", param=name
                ) from None
    return None


async def upload_voice(request: Request) -> Response:
    state = gateway_state(request)
    if (refused := check_request(request)) is not None:
        return error_response(refused, state)
    try:
        body = await read_body(request, MAX_UPLOAD_BYTES + _FORM_OVERHEAD)
        fields = _parse_form(request.headers.get("content-type", ""), body)
        audio_field = next((f for f in _AUDIO_FIELDS if f in fields), None)
        if audio_field is None:
            raise GatewayError(
                ErrorCode.INVALID_CONFIG, "the `audio` file field is required", param="audio"
            )
        raw_name = _text(fields, "name")
        if raw_name is None:
            raise GatewayError(ErrorCode.INVALID_CONFIG, "`name` is required", param="name")
        name = validate_name(raw_name)
        consent = (_text(fields, "consent") or "").strip()
        if consent.casefold() in _NO:
            raise GatewayError(
                ErrorCode.INVALID_CONFIG,
                "`consent` is required: confirm the speaker agreed to having their voice"
                " cloned (e.g. consent=true, or a consent record id)",
                param="consent",
            )
        ref_text = _text(fields, "ref_text") or ""
        description = _text(fields, *_DESCRIPTION_FIELDS) or ""
        for label, value in (("ref_text", ref_text), ("description", description)):
            if len(value) > MAX_TEXT_CHARS or "\x00" in value:
                raise GatewayError(
                    ErrorCode.INVALID_CONFIG,
                    f"`{label}` must be at most {MAX_TEXT_CHARS} characters, without NUL",
                    param=label,
                )
        data = fields[audio_field][0]
        fmt, duration, rate = await asyncio.to_thread(check_audio, data)
        voice = await asyncio.to_thread(
            voice_store(request).add,
            name=name,
            data=data,
            fmt=fmt,
            duration_s=duration,
            sample_rate=rate,
            consent=consent,
            ref_text=ref_text,
            description=description,
            reserved=reserved_names(state.engine, state.settings),
        )
    except GatewayError as exc:
        return error_response(exc, state)
    return JSONResponse(
        {**voice.public(), "type": "uploaded", "speakable": can_clone(state.engine)},
        status_code=201,
    )


async def delete_voice(request: Request) -> Response:
    state = gateway_state(request)
    if (refused := check_request(request)) is not None:
        return error_response(refused, state)
    name: str = request.path_params["name"]
    if state.engine.find_voice(name) is not None or name.strip().casefold() in (
        state.settings.alias_table
    ):
        return error_response(
            GatewayError(
                ErrorCode.INVALID_STATE,
                f"{name!r} is a built-in voice or alias and cannot be deleted",
                param="name",
            ),
            state,
        )
    removed = await asyncio.to_thread(voice_store(request).remove, name)
    if removed is None:
        return error_response(
            GatewayError(
                ErrorCode.UNKNOWN_VOICE, f"no uploaded voice named {name!r}", param="name"
            ),
            state,
        )
    return JSONResponse({"name": removed.name, "id": removed.id, "deleted": True})


def voice_routes() -> list[Route]:
    return [
        Route("/v1/audio/voices", list_voices, methods=["GET"]),
        Route("/v1/audio/voices", upload_voice, methods=["POST"]),
        Route("/v1/audio/voices/{name:path}", delete_voice, methods=["DELETE"]),
    ]
