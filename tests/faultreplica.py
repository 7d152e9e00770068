"""A fault-injecting speech replica for tests: a real HTTP server (uvicorn
on loopback, in a daemon thread) that answers ``POST /v1/audio/speech`` as
told, and the probes a front gateway sends.

Where ``tests/faultproxy.py`` breaks the TCP stream of a real gateway, this
replica breaks the HTTP answer itself: what a proxy's error page, a server
that speaks on forever or trickles, or a lying header looks like.  The
``speech`` mode is read per request (a plain attribute write between
requests):

* ``ok``: 16-bit PCM at ``RATE`` (a tone), 60 ms per character of input,
  declared with ``X-Sample-Rate`` as this gateway does;
* ``html``: ``200 text/html``, a proxy's error page;
* ``json``: ``200 application/json``, an error document;
* ``endless``: PCM for as long as the client reads;
* ``trickle``: 0.2 s of audio, then 4 bytes a second;
* ``rate``: the ``ok`` audio declared ``X-Sample-Rate: 1000``;
* ``status``: ``status`` (429, 503, ...) with a JSON error whose message
  holds ``leak`` (a URL and a key, for the redaction tests);
* ``sse_leak``: an SSE error event whose message holds ``leak``.

``open_bodies`` counts speech bodies being sent now (a body the client
dropped ends, and is no longer counted), ``speech_requests`` every request,
``bodies`` keeps each request's JSON.  ``omni_speed_rule``: a streamed
request with ``speed`` other than 1.0 is refused (400) as vllm-omni 0.30
refuses it for a model without native speed control.
The probes: ``/health``, ``/healthz`` (200), ``/v1/models`` (200 unless
``models_fail`` is set), ``/v1/audio/voices`` (``voices``, this gateway's
``data`` shape, with ``RATE`` unless ``listed_rates`` is off).  A
``response_format: "wav"`` request (the gateway's rate probe) gets a WAV
stream at ``RATE``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

RATE = 22050
#: what a leaky replica puts in its error text
LEAK = (
    "see http://admin:hunter2@10.1.2.3:9000/debug?token=abc with api_key=sk-live-0123456789abcdef"
)


def tone(seconds: float) -> bytes:
    t = np.arange(int(seconds * RATE)) / RATE
    return (np.sin(2 * np.pi * 220 * t) * 8000).astype("<i2").tobytes()


def wav_header() -> bytes:
    """A streaming WAV header (open sizes) for 16-bit mono at ``RATE``."""
    fmt = struct.pack("<HHIIHH", 1, 1, RATE, RATE * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 0xFFFFFFFF)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", 0xFFFFFFFF)
    )


@dataclass
class FaultReplica:
    speech: str = "ok"
    status: int = 503
    models_fail: bool = False
    voices: list[str] = field(default_factory=lambda: ["tone"])
    #: the listing gives each voice's rate (vllm-omni's does not)
    listed_rates: bool = True
    #: answer a streamed request with ``speed`` other than 1.0 as vllm-omni
    #: 0.30 does for a model without native speed control (400)
    omni_speed_rule: bool = False
    speech_requests: int = 0
    open_bodies: int = 0
    #: every speech request's JSON body, in order
    bodies: list[dict[str, object]] = field(default_factory=list)
    port: int = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> Starlette:
        async def ok(request: Request) -> Response:
            return JSONResponse({"status": "ok"})

        async def models(request: Request) -> Response:
            if self.models_fail:
                return JSONResponse({"error": "warming"}, status_code=503)
            return JSONResponse({"object": "list", "data": [{"id": "fault"}]})

        async def voices(request: Request) -> Response:
            data = [
                {"name": v, "type": "builtin", "language": "en-US"}
                | ({"sample_rate": RATE} if self.listed_rates else {})
                for v in self.voices
            ]
            return JSONResponse({"object": "list", "data": data})

        async def speech(request: Request) -> Response:
            self.speech_requests += 1
            body = await request.json()
            self.bodies.append(body)
            streamed = body.get("stream") is True or body.get("stream_format") is not None
            if self.omni_speed_rule and streamed and body.get("speed", 1.0) != 1.0:
                message = (  # vllm-omni 0.30's serving_speech.py words
                    "Streaming is not supported with speed adjustment. Use a non-streaming"
                    " request or remove the speed parameter."
                )
                return JSONResponse({"error": {"message": message}}, 400)
            text = str(body.get("input", ""))
            mode = self.speech
            pcm_headers = {"X-Sample-Rate": str(RATE)}
            if mode == "html":
                page = "<html><body><h1>502 Bad Gateway</h1></body></html>" * 40
                return Response(page, media_type="text/html")
            if mode == "json":
                return JSONResponse({"error": {"message": "model not loaded"}})
            if mode == "status":
                return JSONResponse({"error": {"message": f"full: {LEAK}"}}, self.status)
            if mode == "sse_leak":
                event = {"type": "speech.audio.error", "error": {"message": f"boom: {LEAK}"}}
                return Response(f"data: {json.dumps(event)}\n\n", media_type="text/event-stream")
            if mode == "rate":
                pcm_headers = {"X-Sample-Rate": "1000"}
            if body.get("response_format") == "wav":  # the gateway's rate probe
                return Response(wav_header() + tone(0.06 * len(text)), media_type="audio/wav")
            return StreamingResponse(
                self._body(mode, text), media_type="audio/pcm", headers=pcm_headers
            )

        return Starlette(
            routes=[
                Route("/health", ok),
                Route("/healthz", ok),
                Route("/v1/models", models),
                Route("/v1/audio/voices", voices),
                Route("/v1/audio/speech", speech, methods=["POST"]),
            ]
        )

    async def _body(self, mode: str, text: str) -> AsyncIterator[bytes]:
        self.open_bodies += 1
        try:
            if mode == "endless":
                chunk = tone(0.1)
                while True:
                    yield chunk
                    await asyncio.sleep(0)
            elif mode == "trickle":
                yield tone(0.2)
                while True:
                    await asyncio.sleep(1.0)
                    yield b"\0\0\0\0"
            else:
                yield tone(0.06 * len(text))
        finally:
            self.open_bodies -= 1


@contextmanager
def fault_replica(port: int = 0, **options: object) -> Iterator[FaultReplica]:
    replica = FaultReplica(**options)  # type: ignore[arg-type]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    replica.port = sock.getsockname()[1]
    config = uvicorn.Config(replica.app(), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        threading.Event().wait(0.02)
    else:
        raise RuntimeError("the fault replica did not start")
    try:
        yield replica
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
