"""Server-sent events for ``stream_format: "sse"`` (and vllm-omni's
``stream: true``), in vllm-omni 0.30's form, which is OpenAI's speech events
with an ``event:`` line before each ``data:`` line:

* ``speech.audio.delta``: ``{"type", "audio": base64 of the encoded
  stream, "response_format"}``;
* ``speech.audio.done``: ``{"type", "usage": {"input_tokens",
  "output_tokens", "total_tokens", "input_token_details": {"text_tokens",
  "audio_tokens"}}, "audio_ms", "sample_rate"}``;
* ``speech.audio.error`` if the audio fails (the status went out with the
  first event): ``{"type", "error": {"message", "type", "param", "code"}}``,
  with ``partial_audio: true, action: "discard"`` in ``error`` once audio
  was sent, as 0.30 marks it.

No tokenizer here: ``input_tokens`` counts characters, ``output_tokens``
milliseconds of audio (``audio_tokens``: no reference audio conditions it).
A whole file (``stream: false``) carries the same usage in 0.30's
``X-VLLM-OMNI-*`` headers (``usage_headers``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator
from typing import Any

from gateway.audio.containers import ContainerEncoder
from gateway.errors import GatewayError
from gateway.http.errors import error_body, internal_error
from gateway.http.plan import SpeechPlan
from gateway.http.synthesis import encoded_audio
from gateway.state import GatewayState

MEDIA_TYPE = "text/event-stream"


def sse_event(event: dict[str, Any]) -> bytes:
    """One event: an ``event:`` line naming its ``type``, one ``data:`` line."""
    data = json.dumps(event, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def usage(characters: int, audio_ms: int) -> dict[str, Any]:
    """vllm-omni 0.30's ``SpeechTokenUsage`` in characters and milliseconds."""
    return {
        "input_tokens": characters,
        "output_tokens": audio_ms,
        "total_tokens": characters + audio_ms,
        "input_token_details": {"text_tokens": characters, "audio_tokens": 0},
    }


#: vllm-omni 0.30's usage headers of a whole file (``serving_speech.py``)
USAGE_HEADERS = {
    "X-VLLM-OMNI-INPUT-TOKENS": ("input_tokens",),
    "X-VLLM-OMNI-OUTPUT-TOKENS": ("output_tokens",),
    "X-VLLM-OMNI-TOTAL-TOKENS": ("total_tokens",),
    "X-VLLM-OMNI-INPUT-TEXT-TOKENS": ("input_token_details", "text_tokens"),
    "X-VLLM-OMNI-INPUT-AUDIO-TOKENS": ("input_token_details", "audio_tokens"),
}


def usage_headers(counts: dict[str, Any]) -> dict[str, str]:
    """A ``usage`` as 0.30's ``X-VLLM-OMNI-*`` headers."""
    out = {}
    for header, path in USAGE_HEADERS.items():
        value: Any = counts
        for key in path:
            value = value[key]
        out[header] = str(value)
    return out


async def sse_events(
    state: GatewayState, plan: SpeechPlan, label: str, encoder: ContainerEncoder
) -> AsyncGenerator[bytes, None]:
    audio = encoded_audio(state, plan, label, encoder)
    sent = False
    try:
        async for data in audio:
            yield sse_event(
                {
                    "type": "speech.audio.delta",
                    "audio": base64.b64encode(data).decode(),
                    "response_format": plan.response_format,
                }
            )
            sent = True
    except Exception as exc:
        error = exc if isinstance(exc, GatewayError) else internal_error("SSE speech")
        body = error_body(error)
        if sent:
            body["error"].update(partial_audio=True, action="discard")
        yield sse_event({"type": "speech.audio.error", **body})
        return
    finally:
        await audio.aclose()
    audio_ms = round(encoder.samples * 1000 / plan.sample_rate)
    yield sse_event(
        {
            "type": "speech.audio.done",
            "usage": usage(len(plan.text), audio_ms),
            "audio_ms": audio_ms,
            "sample_rate": plan.sample_rate,
        }
    )
