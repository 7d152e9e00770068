"""``/v1/audio/voices``: list, upload and delete voices; voice name lookup.

Built-in voices come from the engine, OpenAI names from the configured alias
table (``voice_aliases``), uploaded reference voices from ``VoiceStore``.
``resolve_voice`` is the one lookup the speech routes use: an engine voice,
then an alias, then an uploaded voice (which the engine must be able to
clone, else ``unsupported_option``), else ``unknown_voice`` listing them all.

Uploads are ``multipart/form-data``, parsed with the standard library's
``email`` parser (no extra dependency) after the body is read under a cap.
Listing, validation, storing and deleting are ``gateway.voices``, shared
with the WebSocket's ``voice.*`` messages; this module only maps HTTP in and
out.
"""

from __future__ import annotations

from email.message import Message
from email.parser import BytesParser

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.engines.base import VoiceInfo
from gateway.errors import ErrorCode, GatewayError
from gateway.http_errors import check_request, error_response, gateway_state, read_body
from gateway.voice_store import MAX_UPLOAD_BYTES, VoiceStore
from gateway.voices import (
    add_voice,
    find_speakable_voice,
    remove_voice,
    voice_listing,
)

#: multipart overhead allowed on top of the audio itself
_FORM_OVERHEAD = 64 * 1024
_AUDIO_FIELDS = ("audio", "audio_sample")
_DESCRIPTION_FIELDS = ("description", "speaker_description")


def voice_store(request: Request) -> VoiceStore:
    store: VoiceStore = request.app.state.voice_store
    return store


async def resolve_voice(request: Request, raw: str) -> VoiceInfo:
    """The engine voice to speak ``raw`` with, or ``GatewayError``."""
    state = gateway_state(request)
    return await find_speakable_voice(state.engine, state.settings, voice_store(request), raw)


# --- routes ------------------------------------------------------------------------


async def list_voices(request: Request) -> Response:
    state = gateway_state(request)
    if (refused := check_request(request)) is not None:
        return error_response(refused, state)
    return JSONResponse(await voice_listing(state.engine, state.settings, voice_store(request)))


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
        voice = await add_voice(
            state.engine,
            state.settings,
            voice_store(request),
            name=raw_name,
            data=fields[audio_field][0],
            consent=_text(fields, "consent"),
            ref_text=_text(fields, "ref_text") or "",
            description=_text(fields, *_DESCRIPTION_FIELDS) or "",
        )
    except GatewayError as exc:
        return error_response(exc, state)
    return JSONResponse(voice, status_code=201)


async def delete_voice(request: Request) -> Response:
    state = gateway_state(request)
    if (refused := check_request(request)) is not None:
        return error_response(refused, state)
    name: str = request.path_params["name"]
    try:
        removed = await remove_voice(state.engine, state.settings, voice_store(request), name)
    except GatewayError as exc:
        return error_response(exc, state)
    return JSONResponse(removed)


def voice_routes() -> list[Route]:
    return [
        Route("/v1/audio/voices", list_voices, methods=["GET"]),
        Route("/v1/audio/voices", upload_voice, methods=["POST"]),
        Route("/v1/audio/voices/{name:path}", delete_voice, methods=["DELETE"]),
    ]
