"""Batch speech: many texts in one request, each item a whole file, base64
in one JSON answer, in two shapes over one core:

* ``POST /v1/audio/speech/batch``: vllm-omni 0.30's route and answer,
  ``{id, results: [{index, status: "success"|"error", audio_data,
  media_type, error, usage}], total, succeeded, failed}``, with 0.30's
  ``response_format`` default (``wav``);
* ``POST /v1/audio/speech/batch/gateway``: the gateway's own answer
  (``{object, succeeded, failed, data: [...]}``, an item's error in
  OpenAI's error shape), with the ``http_compat`` default format.

The body is ``{"items": [...], ...shared defaults}``; each item overrides
the defaults and becomes a plan through the same ``make_plan`` a single
request uses (so nothing a single request passes to the engine is lost).
Whole-batch checks run before any item is synthesized: the item count, the
total characters, and the type of every ``input`` (one that is not a
string makes the character count meaningless, so the whole batch is
refused with the code the single endpoint gives: ``invalid_message``, with
the item's path as msgspec words it).  An item's own mistake or failure is
that item's ``error``; the others still run.  Keys that no field names are
ignored and named, as a single request's are: every one by its path in
``X-Ignored-Fields`` (``temperature``, ``items[1].top_p``), and in each
result's ``ignored_fields`` the ones its request carried (``ignored_keys``).
Items wait (as long as needed) for a slot of ``max_http_streams``
(``GatewayState.http_admission``, the shared admission queue) and at most
``batch_concurrency`` run at once.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import json
import math
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from gateway.audio.containers import ContainerEncoder
from gateway.errors import ErrorCode, GatewayError
from gateway.flow.admission import Refused
from gateway.http.admission import http_busy, http_client
from gateway.http.errors import (
    check_request,
    error_body,
    error_response,
    gateway_state,
    internal_error,
    read_body,
)
from gateway.http.plan import (
    BODY_FIELDS,
    IGNORED_FIELDS_HEADER,
    SpeechPlan,
    decode_body,
    ignored_fields_header,
    make_plan,
)
from gateway.http.response import SpeechResponse
from gateway.http.sse import usage
from gateway.http.synthesis import encoded_audio
from gateway.protocol import too_deep
from gateway.session.validation import invalid_message, named_fields, unknown_fields

_batch_ids = itertools.count(1)

_JSON_NAMES = {
    type(None): "null",
    bool: "bool",
    int: "int",
    float: "float",
    list: "array",
    dict: "object",
}


def check_batch_inputs(items: list[Any], defaults: dict[str, Any]) -> None:
    """Raise ``invalid_message`` for the first ``input`` that is not a string."""
    if "input" in defaults and not isinstance(defaults["input"], str):
        raise _not_a_string(defaults["input"], "$.input", "input")
    for index, item in enumerate(items):
        if isinstance(item, dict) and "input" in item and not isinstance(item["input"], str):
            raise _not_a_string(item["input"], f"$.items[{index}].input", "items")


def _not_a_string(value: object, path: str, param: str) -> GatewayError:
    kind = _JSON_NAMES.get(type(value), type(value).__name__)
    return invalid_message(f"Expected `str`, got `{kind}` - at `{path}`", param)


def batch_items(raw: bytes, max_items: int, max_chars: int) -> tuple[list[Any], dict[str, Any]]:
    """The items and the shared defaults of a batch body, or ``GatewayError``."""
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise GatewayError(ErrorCode.INVALID_JSON, f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise too_deep() from None
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise invalid_message(
            "the body must be an object with an `items` array (and shared defaults)", "items"
        )
    items: list[Any] = doc.pop("items")
    if not items:
        raise invalid_message("`items` is empty", "items")
    if len(items) > max_items:
        raise invalid_message(f"{len(items)} items; a batch holds at most {max_items}", "items")
    check_batch_inputs(items, doc)
    total = sum(len(i.get("input", "")) for i in items if isinstance(i, dict))
    if total > max_chars:
        raise GatewayError(
            ErrorCode.TEXT_TOO_LONG,
            f"the batch has {total} input characters; the limit is {max_chars}",
            param="items",
        )
    return items, doc


def ignored_keys(items: list[Any], defaults: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """A batch's keys that no field names: every one by its path (a shared
    default by its name, an item's as ``items[i].name``), and for each item
    the names its request carries (the shared defaults', then its own; none
    for an item that is not an object, which is never spoken)."""
    shared = unknown_fields(list(defaults), BODY_FIELDS)
    paths = list(shared)
    per_item: list[list[str]] = []
    for index, item in enumerate(items):
        own = unknown_fields(list(item), BODY_FIELDS) if isinstance(item, dict) else []
        paths += [f"items[{index}].{name}" for name in own]
        merged = [*shared, *(n for n in own if n not in shared)]
        per_item.append(merged if isinstance(item, dict) else [])
    return paths, per_item


@dataclass(frozen=True)
class _Spoken:
    data: bytes
    media_type: str
    samples: int


async def _speak_item(request: Request, plan: SpeechPlan, limit: asyncio.Semaphore) -> _Spoken:
    state = gateway_state(request)
    slots = state.http_admission
    async with limit:
        try:  # batch items wait as long as needed (the queue's length still bounds)
            ticket = await slots.acquire(http_client(request, state), deadline_s=math.inf)
        except Refused as refused:
            raise http_busy(slots, refused.ticket) from None
        try:
            encoder = ContainerEncoder(plan.response_format, plan.sample_rate, stream=False)
            audio = encoded_audio(state, plan, f"http-batch-{next(_batch_ids)}", encoder)
            try:
                data = b"".join([piece async for piece in audio])
            finally:
                await audio.aclose()
        finally:
            slots.release(ticket)
    return _Spoken(data, encoder.media_type, encoder.samples)


@dataclass(frozen=True)
class ItemResult:
    """One item's outcome: its plan and audio, or its error."""

    index: int
    plan: SpeechPlan | None = None
    spoken: _Spoken | None = None
    error: GatewayError | None = None
    #: the keys of its request that no field names (ignored)
    ignored: tuple[str, ...] = ()


def with_ignored(result: ItemResult, answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` with ``ignored_fields`` when its request had unknown keys
    (left out otherwise, as 0.30 leaves out its None fields)."""
    if result.ignored:
        answer["ignored_fields"] = named_fields(result.ignored)
    return answer


async def _item(
    request: Request, index: int, fields: dict[str, Any], limit: asyncio.Semaphore
) -> ItemResult:
    """One item's result: its audio, or its error (the other items go on)."""
    state = gateway_state(request)
    try:
        plan = await make_plan(request, decode_body(fields), batch=True)
        spoken = await _speak_item(request, plan, limit)
    except GatewayError as exc:
        error = exc
    except Exception:
        error = internal_error(f"batch item {index}")
    else:
        return ItemResult(index, plan, spoken)
    state.metrics.errors.labels(code=str(error.code)).inc()
    return ItemResult(index, error=error)


def gateway_result(result: ItemResult) -> dict[str, Any]:
    """An item in the gateway's own shape (``/v1/audio/speech/batch/gateway``)."""
    if result.error is not None:
        return {"index": result.index, "status": "error", **error_body(result.error)}
    plan, spoken = result.plan, result.spoken
    assert plan is not None and spoken is not None
    return {
        "index": result.index,
        "status": "ok",
        "media_type": spoken.media_type,
        "response_format": plan.response_format,
        "sample_rate": plan.sample_rate,
        "voice": plan.voice.name,
        "audio_ms": round(spoken.samples * 1000 / plan.sample_rate, 1),
        "audio": base64.b64encode(spoken.data).decode(),
    }


def gateway_answer(results: list[ItemResult]) -> dict[str, Any]:
    data = [with_ignored(r, gateway_result(r)) for r in results]
    ok = sum(1 for r in data if r["status"] == "ok")
    return {"object": "list", "succeeded": ok, "failed": len(data) - ok, "data": data}


def omni_result(result: ItemResult) -> dict[str, Any]:
    """An item as vllm-omni 0.30's ``SpeechBatchItemResult`` (None fields
    left out, as 0.30 answers), plus the gateway's ``response_format``,
    ``sample_rate``, ``voice`` and ``audio_ms``, or ``code`` and ``param``."""
    if result.error is not None:
        error = result.error
        return {
            "index": result.index,
            "status": "error",
            "error": error.message,
            "code": str(error.code),
            "param": error.param,
        }
    plan, spoken = result.plan, result.spoken
    assert plan is not None and spoken is not None
    audio_ms = round(spoken.samples * 1000 / plan.sample_rate)
    return {
        "index": result.index,
        "status": "success",
        "audio_data": base64.b64encode(spoken.data).decode(),
        "media_type": spoken.media_type,
        "usage": usage(len(plan.text), audio_ms),
        "response_format": plan.response_format,
        "sample_rate": plan.sample_rate,
        "voice": plan.voice.name,
        "audio_ms": audio_ms,
    }


def omni_answer(results: list[ItemResult]) -> dict[str, Any]:
    """vllm-omni 0.30's ``BatchSpeechResponse``."""
    # 0.30's model ignores the keys it does not declare (``ignored_fields`` too)
    items = [with_ignored(r, omni_result(r)) for r in results]
    ok = sum(1 for r in items if r["status"] == "success")
    return {
        "id": f"speech-batch-{uuid.uuid4().hex}",
        "results": items,
        "total": len(items),
        "succeeded": ok,
        "failed": len(items) - ok,
    }


#: vllm-omni 0.30's ``BatchSpeechRequest.response_format`` default
OMNI_BATCH_FORMAT = "wav"


async def _batch(
    request: Request,
    answer: Callable[[list[ItemResult]], dict[str, Any]],
    default_format: str | None,
) -> Response | SpeechResponse:
    state = gateway_state(request)
    if (refused := check_request(request)) is not None:
        return error_response(refused, state)
    settings = state.settings
    limit_bytes = max(settings.max_message_bytes, 8 * settings.max_batch_chars)
    try:
        raw = await read_body(request, limit_bytes)
        items, defaults = batch_items(raw, settings.max_batch_items, settings.max_batch_chars)
    except GatewayError as exc:
        return error_response(exc, state)
    paths, ignored = ignored_keys(items, defaults)
    if default_format is not None:
        defaults.setdefault("response_format", default_format)
    concurrency = asyncio.Semaphore(settings.batch_concurrency)

    async def run(index: int, item: Any) -> ItemResult:
        if not isinstance(item, dict):
            error = GatewayError(ErrorCode.INVALID_MESSAGE, "a batch item must be an object")
            return ItemResult(index, error=error)
        # an item's null leaves the shared default in place (0.30's merge)
        given = {k: v for k, v in item.items() if v is not None or k == "input"}
        result = await _item(request, index, {**defaults, **given}, concurrency)
        return dataclasses.replace(result, ignored=tuple(ignored[index]))

    async def body() -> AsyncGenerator[bytes, None]:
        results = await asyncio.gather(*(run(i, item) for i, item in enumerate(items)))
        yield json.dumps(answer(list(results))).encode()

    headers = {IGNORED_FIELDS_HEADER: ignored_fields_header(paths)} if paths else {}
    return SpeechResponse(
        body(), media_type="application/json", headers=headers, state=state, whole=True
    )


async def speech_batch(request: Request) -> Response | SpeechResponse:
    """``POST /v1/audio/speech/batch``: vllm-omni 0.30's route and shape."""
    return await _batch(request, omni_answer, OMNI_BATCH_FORMAT)


async def speech_batch_gateway(request: Request) -> Response | SpeechResponse:
    """``POST /v1/audio/speech/batch/gateway``: the gateway's own shape."""
    return await _batch(request, gateway_answer, None)
