"""The OpenAI-compatible speech routes: ``POST /v1/audio/speech`` and the
batch routes (``POST /v1/audio/speech/batch``, vllm-omni 0.30's shape, and
``/v1/audio/speech/batch/gateway``, the gateway's own).  Thin: each concept
lives in its module.

* ``gateway.http.plan``: the request schema, validated into a ``SpeechPlan``;
* ``gateway.http.synthesis``: the plan spoken through the delivery pipeline
  (``gateway.text.pipeline``) and encoded (``ContainerEncoder``);
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

import itertools
import logging
from collections.abc import AsyncGenerator

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
from gateway.http.plan import SpeechPlan, decode_body, make_plan
from gateway.http.response import SpeechResponse
from gateway.http.synthesis import encoded_audio

log = logging.getLogger(__name__)

SAMPLE_RATE_HEADER = "X-Sample-Rate"
_request_ids = itertools.count(1)
#: the status of a request whose client left while it waited for a slot (never sent)
CLIENT_CLOSED = 499


def _headers(plan: SpeechPlan) -> dict[str, str]:
    headers = {SAMPLE_RATE_HEADER: str(plan.sample_rate), "Cache-Control": "no-store"}
    if plan.response_format == "pcm":
        headers["X-Audio-Encoding"] = "pcm_s16le"
    return headers


async def _then_usage_headers(
    body: AsyncGenerator[bytes, None],
    plan: SpeechPlan,
    encoder: ContainerEncoder,
    headers: dict[str, str],
) -> AsyncGenerator[bytes, None]:
    """``body``, then vllm-omni 0.30's usage headers of a whole file
    (``sse.usage_headers``: the usage SSE's ``speech.audio.done`` carries)."""
    try:
        async for piece in body:
            yield piece
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
        plan = await make_plan(request, decode_body(raw))
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
    headers = _headers(plan)
    if plan.mode == "sse":
        body = sse.sse_events(state, plan, label, encoder)
        media_type = sse.MEDIA_TYPE
    else:
        body = encoded_audio(state, plan, label, encoder)
        media_type = encoder.media_type
        if plan.mode == "file":  # its headers go out after the whole body
            body = _then_usage_headers(body, plan, encoder, headers)
    return SpeechResponse(
        body,
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
