"""``GET /v1/models``: the model ids ``POST /v1/audio/speech`` accepts, in
vLLM's ``ModelList`` shape (what vllm-omni 0.30 answers, and what its
benchmark reads for a model id when it is given none).

The engine's own name comes first (a client taking ``data[0].id`` speaks
with the engine it names), then the models the engine serves (an
upstream's), then OpenAI's names, which mean the same engine.  The list is
the one ``session.validation.check_model`` accepts, so every id listed is
one a speech request may send.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.engines.base import Engine
from gateway.http.errors import check_request, error_response, gateway_state
from gateway.session.validation import MODEL_ALIASES

OWNER = "voice-gateway"


def model_ids(engine: Engine) -> list[str]:
    """Every ``model`` a speech request may send, the engine's name first."""
    return list(dict.fromkeys([engine.name, *engine.model_names(), *sorted(MODEL_ALIASES)]))


def model_list(engine: Engine, created: int) -> dict[str, Any]:
    """vLLM's ``ModelList``: ``{"object": "list", "data": [ModelCard ...]}``."""
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": OWNER,
                "root": engine.name,
                "parent": None if model == engine.name else engine.name,
                "max_model_len": None,
                "permission": [],
            }
            for model in model_ids(engine)
        ],
    }


async def list_models(request: Request) -> Response:
    state = gateway_state(request)
    if (refused := check_request(request)) is not None:
        return error_response(refused, state)
    return JSONResponse(model_list(state.engine, int(time.time())))


def model_routes() -> list[Route]:
    return [Route("/v1/models", list_models, methods=["GET"])]
