"""The Starlette application factory.

Engines are created and warmed in the lifespan and shared through
``app.state.gateway`` (never loaded at import time).  ``/readyz`` turns ready
only after warm-up.  The lifespan also returns the heap's free memory to the
system after warm-up and whenever the engine goes idle (``ops/heap.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from gateway import __version__
from gateway.engines.base import Engine
from gateway.engines.registry import create_engine
from gateway.http.guard import ApiGuard
from gateway.http.models import model_routes
from gateway.http.outbound import remember_http_cycle
from gateway.http.speech import log_format_support, speech_routes
from gateway.http.voices import voice_routes
from gateway.ops.heap import trim_heap, trim_when_idle
from gateway.ops.logs import quiet_client_mistakes
from gateway.ops.metrics import Metrics, watch_loop_lag
from gateway.ops.resources import WEB_DIR
from gateway.settings import Settings, SettingsError
from gateway.state import GatewayState
from gateway.text.frontend import warm_up
from gateway.text.stage import LexiconError, load_lexicon
from gateway.voices.store import VoiceStore
from gateway.ws.endpoint import stream_endpoint
from gateway.ws.outbound import TransportMiddleware

log = logging.getLogger(__name__)


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok", "version": __version__})


def _not_ready(state: GatewayState) -> Response | None:
    """503 while starting, draining or with no engine (None: ready)."""
    if state.ready and not state.shutting_down and state.engine.ready():
        return None
    status = (
        "shutting_down"
        if state.shutting_down
        else "engine_unavailable"  # e.g. no upstream replica is healthy
        if state.ready
        else "starting"
    )
    return JSONResponse({"status": status}, status_code=503)


async def readyz(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    not_ready = _not_ready(state)
    if not_ready is not None:
        return not_ready
    # saturated (requests waiting for a slot) is still ready: see docs/deployment.md
    saturated = bool(state.admission.queue.depth or state.http_admission.queue.depth)
    return JSONResponse({"status": "ready", "engine": state.engine.name, "saturated": saturated})


async def door(request: Request) -> Response:
    """``/readyz/conversations``: ready for a new conversation.  503 ``full``
    while the door is closed (a new WebSocket session would wait at the door,
    then be refused), so a load balancer sends new conversations elsewhere;
    sessions already admitted are not affected (docs/deployment.md)."""
    state: GatewayState = request.app.state.gateway
    not_ready = _not_ready(state)
    if not_ready is not None:
        return not_ready
    gate = state.admission
    body = {"admitted": gate.active, "limit": gate.limit, "waiting": gate.depth}
    if state.door_full():
        return JSONResponse({"status": "full", **body}, status_code=503)
    return JSONResponse({"status": "ready", **body})


async def metrics(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


class GatewayApp(Starlette):
    """The Starlette app, remembering uvicorn's HTTP request cycle in the
    scope before Starlette's own outermost middleware wraps ``send``: the
    HTTP stall timeout aborts a stalled transport through it
    (``gateway.http.outbound``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        remember_http_cycle(scope, send)
        await super().__call__(scope, receive, send)


def create_app(settings: Settings, engine: Engine | None = None) -> Starlette:
    """Build the app.  An ``engine`` passed in must be started already and is
    not closed by the app (tests share one engine between servers)."""
    owns_engine = engine is None
    quiet_client_mistakes()
    the_engine = engine if engine is not None else create_engine(settings)
    try:
        lexicon = load_lexicon(settings.lexicon_file)
    except LexiconError as exc:
        raise SettingsError(str(exc)) from None
    state = GatewayState(settings=settings, engine=the_engine, metrics=Metrics(), lexicon=lexicon)
    state.metrics.track_engine(
        the_engine.queue_depth, the_engine.live_jobs, the_engine.largest_work_item
    )
    for collector in the_engine.collectors():
        state.metrics.registry.register(collector)  # type: ignore[arg-type]
    voice_store = VoiceStore(settings.data_path)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        lag = asyncio.create_task(watch_loop_lag(state.metrics), name="loop-lag")
        follower: asyncio.Task[None] | None = None
        trim = asyncio.create_task(trim_when_idle(the_engine.live_jobs), name="heap-trim")
        try:
            await asyncio.to_thread(voice_store.open)
            the_engine.use_voice_store(voice_store)
            log_format_support()
            # the front-end's first emoji loads the emoji tables: not in a session
            await asyncio.to_thread(warm_up)
            if owns_engine:
                log.info("loading engine %s", the_engine.name)
                await the_engine.start()
                # loading and warm-up leave free heap behind: idle RSS starts low
                await asyncio.to_thread(trim_heap)
            if settings.max_active_streams == 0:
                follower = await state.start_automatic_admission()
            state.ready = True
            log.info(
                "ready: engine %s, voices %s",
                the_engine.name,
                ", ".join(v.name for v in the_engine.voices()),
            )
            yield
        finally:
            state.ready = False
            state.shutting_down = True
            tasks = [t for t in (lag, trim, follower) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if owns_engine:
                await the_engine.aclose()
            state.http_text_reader.shutdown(wait=False, cancel_futures=True)
            await asyncio.to_thread(voice_store.close)

    routes = [
        Route("/healthz", healthz),
        # vllm-omni's and vLLM's liveness path: a gateway is a replica on the defaults
        Route("/health", healthz),
        Route("/readyz", readyz),
        Route("/readyz/conversations", door),
        Route("/metrics", metrics),
        WebSocketRoute("/v1/audio/speech/stream", stream_endpoint),
        *speech_routes(),
        *voice_routes(),
        *model_routes(),
    ]
    # the demo page ships inside the package (gateway/ops/resources.py): serve it
    # unconditionally, so a packaging mistake fails at start, not as a 404
    routes.append(Mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web"))
    # the stall timeout reaches uvicorn's transport through this (ws/outbound.py);
    # it must stay outermost.  ApiGuard: Host, Origin, per-client HTTP limits.
    middleware = [Middleware(TransportMiddleware), Middleware(ApiGuard, state=state)]
    app = GatewayApp(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.gateway = state
    app.state.voice_store = voice_store
    return app
