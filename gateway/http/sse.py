"""Server-sent events for ``stream_format: "sse"``: the encoded audio as
``speech.audio.delta`` events (base64), then ``speech.audio.done`` with the
usage, or one ``error`` event in OpenAI's error shape if the audio fails
(the status went out with the first event)."""

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


def _event(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


async def sse_events(
    state: GatewayState, plan: SpeechPlan, label: str, encoder: ContainerEncoder
) -> AsyncGenerator[bytes, None]:
    audio = encoded_audio(state, plan, label, encoder)
    try:
        async for data in audio:
            yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    except GatewayError as exc:
        yield _event({"type": "error", **error_body(exc)})
        return
    except Exception:
        yield _event({"type": "error", **error_body(internal_error("SSE speech"))})
        return
    finally:
        await audio.aclose()
    audio_ms = round(encoder.samples * 1000 / plan.sample_rate)
    yield _event(
        {
            "type": "speech.audio.done",
            # no tokenizer here: input counts characters, output milliseconds
            "usage": {
                "input_tokens": len(plan.text),
                "output_tokens": audio_ms,
                "total_tokens": len(plan.text) + audio_ms,
            },
            "audio_ms": audio_ms,
            "sample_rate": plan.sample_rate,
        }
    )
