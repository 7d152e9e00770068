"""``/v1/audio/voices``: list, upload and delete voices; voice name lookup.

Built-in voices come from the engine, OpenAI names from the configured alias
table (``voice_aliases``), uploaded reference voices from ``VoiceStore``.
``resolve_voice`` is the one lookup the speech routes use: an engine voice,
then an alias, then an uploaded voice (which the engine must be able to
clone, else ``unsupported_option``), else ``unknown_voice`` listing them all.

Answers are vllm-omni 0.30's: an upload is ``200 {"success": true, "voice":
{...}}`` (the gateway's fields and 0.30's), a deletion ``200 {"success":
true, "message", "name", "id", "deleted"}``, an unknown name ``404
not_found``; the listing has 0.30's ``voices`` and ``uploaded_voices`` beside
the gateway's ``data``.

Uploads are ``multipart/form-data``: the body is read under a cap, then
parsed in a worker thread with part-count and part-size limits
(``gateway.voices.forms``), never on the event loop.
Listing, validation, storing and deleting are ``gateway.voices.catalog``, shared
with the WebSocket's ``voice.*`` messages; this module only maps HTTP in and
out.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.engines.base import VoiceInfo
from gateway.errors import ErrorCode, GatewayError
from gateway.http.errors import check_request, error_response, gateway_state, read_body
from gateway.voices.catalog import (
    add_voice,
    find_speakable_voice,
    omni_entry,
    remove_voice,
    voice_listing,
)
from gateway.voices.forms import FormPart, parse_form
from gateway.voices.store import MAX_TEXT_CHARS, MAX_UPLOAD_BYTES, VoiceStore

#: multipart overhead allowed on top of the audio itself
_FORM_OVERHEAD = 64 * 1024
#: a text field (name, consent, ref_text, description): UTF-8 of MAX_TEXT_CHARS
_MAX_FIELD_BYTES = 4 * MAX_TEXT_CHARS
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


def _text(fields: dict[str, FormPart], *names: str) -> str | None:
    for name in names:
        if name in fields:
            try:
                return fields[name].data.decode("utf-8")
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
        fields = await asyncio.to_thread(
            parse_form,
            request.headers.get("content-type", ""),
            body,
            max_parts=state.settings.max_form_parts,
            max_field_bytes=_MAX_FIELD_BYTES,
            max_file_bytes=MAX_UPLOAD_BYTES,
            file_fields=_AUDIO_FIELDS,
        )
        if "speaker_embedding" in fields:  # vllm-omni 0.30's other kind of upload
            raise GatewayError(
                ErrorCode.UNSUPPORTED_OPTION,
                "`speaker_embedding` uploads are not supported: the gateway keeps reference"
                " audio only; upload the recording as `audio_sample` (or `audio`)",
                param="speaker_embedding",
            )
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
            data=bytes(fields[audio_field].data),
            consent=_text(fields, "consent"),
            ref_text=_text(fields, "ref_text") or "",
            description=_text(fields, *_DESCRIPTION_FIELDS) or "",
        )
    except GatewayError as exc:
        return error_response(exc, state)
    return JSONResponse({"success": True, "voice": omni_entry(voice)})


async def delete_voice(request: Request) -> Response:
    state = gateway_state(request)
    if (refused := check_request(request)) is not None:
        return error_response(refused, state)
    name: str = request.path_params["name"]
    try:
        removed = await remove_voice(state.engine, state.settings, voice_store(request), name)
    except GatewayError as exc:
        if exc.code is ErrorCode.UNKNOWN_VOICE:  # vllm-omni 0.30's 404
            exc = GatewayError(ErrorCode.NOT_FOUND, exc.message, param=exc.param)
        return error_response(exc, state)
    message = f"Voice '{removed['name']}' deleted successfully"  # 0.30's words
    return JSONResponse({"success": True, "message": message, **removed})


def voice_routes() -> list[Route]:
    return [
        Route("/v1/audio/voices", list_voices, methods=["GET"]),
        Route("/v1/audio/voices", upload_voice, methods=["POST"]),
        Route("/v1/audio/voices/{name:path}", delete_voice, methods=["DELETE"]),
    ]
