"""The OpenAI-compatible speech routes: ``POST /v1/audio/speech`` and the
batch routes (``POST /v1/audio/speech/batch``, vllm-omni 0.30's shape, and
``/v1/audio/speech/batch/gateway``, the gateway's own).  Thin: each concept
lives in its module.

* ``gateway.http.plan``: the request schema, validated into a ``SpeechPlan``;
* ``gateway.http.synthesis``: the plan spoken through the delivery pipeline
  (``gateway.delivery``) and encoded (``ContainerEncoder``);
* ``gateway.http.compat``: where OpenAI and vllm-omni disagree (the default
  format; what ``stream`` and a body without it mean);
* ``gateway.http.sse``: ``stream_format: "sse"`` events;
* ``gateway.http.response``: the ASGI response that stops the work when the
  client goes away;
* ``gateway.http.batch``: the batch route.

Three response modes for a single request (``gateway.http.compat`` picks
one): ``audio`` (``stream_format: "audio"``): a chunked body, each piece
sent as soon as it is encoded; ``sse`` (``stream_format: "sse"``, or
vllm-omni's ``stream: true``): ``speech.audio.delta`` events with base64
audio, then ``speech.audio.done``; ``file`` (``stream: false``): one
complete file with exact headers.

Admission: ``GatewayState.http_admission`` (``max_http_streams``) caps HTTP
synthesis separately from the WebSocket's ``max_active_streams``, with the
same admission queue in front (``gateway.flow.admission``,
``gateway.http.admission``): a request waits up to ``admission_deadline_s``
for a slot, then ``503 busy`` with ``Retry-After``; a request whose client
disconnects while it waits leaves the queue at once (its place goes to the
next; nothing is synthesized); batch items wait as long as needed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.audio.containers import ContainerEncoder, format_support
from gateway.errors import GatewayError
from gateway.flow.admission import ClientGone, Refused
from gateway.http import sse
from gateway.http.admission import disconnected, http_busy, http_client
from gateway.http.batch import speech_batch, speech_batch_gateway
from gateway.http.errors import (
    check_request,
    error_response,
    gateway_state,
    internal_error,
    read_body,
)
from gateway.http.plan import (
    IGNORED_FIELDS_HEADER,
    SpeechPlan,
    decode_request,
    ignored_fields_header,
    make_plan,
)
from gateway.http.response import SpeechResponse
from gateway.http.synthesis import encoded_audio

log = logging.getLogger(__name__)

SAMPLE_RATE_HEADER = "X-Sample-Rate"
#: a body longer than this is decoded off the event loop
DECODE_IN_THREAD_BYTES = 64 * 1024
_request_ids = itertools.count(1)
#: the status of a request whose client left while it waited for a slot (never sent)
CLIENT_CLOSED = 499


#: vllm-omni 0.30's word timings of a whole file, and its marker when they
#: would make the header too large for common proxies
WORD_TIMESTAMPS_HEADER = "X-Word-Timestamps"
WORD_TIMESTAMPS_OMITTED_HEADER = "X-Word-Timestamps-Omitted"
MAX_WORD_TIMESTAMPS_BYTES = 4096


def _headers(plan: SpeechPlan, ignored: list[str]) -> dict[str, str]:
    headers = {SAMPLE_RATE_HEADER: str(plan.sample_rate), "Cache-Control": "no-store"}
    if plan.response_format == "pcm":
        headers["X-Audio-Encoding"] = "pcm_s16le"
    if ignored:  # the body's keys that no field names, ignored
        headers[IGNORED_FIELDS_HEADER] = ignored_fields_header(ignored)
    return headers


def word_timestamp_headers(words: list[dict[str, Any]]) -> dict[str, str]:
    """vllm-omni 0.30's header: ``[{word, start_ms, end_ms}]`` as ASCII JSON,
    or the marker past 4 KB."""
    data = json.dumps(words)
    if len(data) <= MAX_WORD_TIMESTAMPS_BYTES:
        return {WORD_TIMESTAMPS_HEADER: data}
    return {
        WORD_TIMESTAMPS_OMITTED_HEADER: (
            f"oversize; bytes={len(data)}; limit={MAX_WORD_TIMESTAMPS_BYTES}"
        )
    }


async def _then_file_headers(
    body: AsyncGenerator[bytes, None],
    plan: SpeechPlan,
    encoder: ContainerEncoder,
    headers: dict[str, str],
    words: list[dict[str, Any]] | None,
) -> AsyncGenerator[bytes, None]:
    """``body``, then the headers a whole file carries after it: its word
    timings (``word_timestamps``) and vllm-omni 0.30's usage headers
    (``sse.usage_headers``: the usage SSE's ``speech.audio.done`` carries)."""
    try:
        async for piece in body:
            yield piece
        if words is not None:
            headers.update(word_timestamp_headers(words))
        audio_ms = round(encoder.samples * 1000 / plan.sample_rate)
        headers.update(sse.usage_headers(sse.usage(len(plan.text), audio_ms)))
    finally:
        await body.aclose()


async def speech(request: Request) -> Response | SpeechResponse:
    state = gateway_state(request)
    if (refused := check_request(request)) is not None:
        return error_response(refused, state)
    try:
        raw = await read_body(request, state.settings.max_message_bytes)
        if len(raw) > DECODE_IN_THREAD_BYTES:  # megabytes of reference audio
            body, ignored = await asyncio.to_thread(decode_request, raw)
        else:
            body, ignored = decode_request(raw)
        plan = await make_plan(request, body)
    except GatewayError as exc:
        return error_response(exc, state)
    slots = state.http_admission
    try:  # the wait counts in the client's time to first audio
        ticket = await slots.acquire(
            http_client(request, state), gone=lambda: disconnected(request)
        )
    except Refused as no_slot:
        return error_response(http_busy(slots, no_slot.ticket), state)
    except ClientGone:  # nobody to answer: 499, nginx's "client closed request"
        return Response(status_code=CLIENT_CLOSED)
    label = f"http-{next(_request_ids)}"
    try:
        encoder = ContainerEncoder(
            plan.response_format, plan.sample_rate, stream=plan.mode != "file"
        )
    except Exception:
        slots.release(ticket)  # the response that would release it never starts
        return error_response(internal_error(f"creating the {plan.response_format} encoder"), state)
    headers = _headers(plan, ignored)
    if plan.mode == "sse":
        audio = sse.sse_events(state, plan, label, encoder)
        media_type = sse.MEDIA_TYPE
    else:
        words: list[dict[str, Any]] | None = [] if plan.word_timestamps else None
        audio = encoded_audio(state, plan, label, encoder, words)
        media_type = encoder.media_type
        if plan.mode == "file":  # its headers go out after the whole body
            audio = _then_file_headers(audio, plan, encoder, headers, words)
    return SpeechResponse(
        audio,
        media_type=media_type,
        headers=headers,
        state=state,
        whole=plan.mode == "file",
        on_close=lambda: slots.release(ticket),
    )


def speech_routes() -> list[Route]:
    return [
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/audio/speech/batch", speech_batch, methods=["POST"]),
        Route("/v1/audio/speech/batch/gateway", speech_batch_gateway, methods=["POST"]),
    ]


def log_format_support() -> None:
    support = format_support()
    log.info(
        "HTTP formats with libsndfile %s: %s",
        support.libsndfile_version,
        ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in support.available.items()),
    )
