"""vllm-omni 0.30's own client code, run by ``.venv-vllm-omni``'s interpreter
(never imported by the gateway's test process): the tests start it as a
subprocess and read the one JSON line it prints.

``bench BASE_URL CONCURRENCY PROMPTS``: what ``vllm bench serve --omni
--backend openai-audio-speech`` does, from Python (its command line does
not run here: ``vllm_omni/entrypoints/cli/serve.py`` imports ``diffusers``,
which the benchmark does not need; docs/http_api.md): the model id from
``GET /v1/models`` (vLLM's ``get_first_model_from_server``), then
vllm-omni's ``benchmark()`` (``vllm_omni/benchmarks/patch/patch.py``) with
its ``openai-audio-speech`` request function and its metrics, at
``CONCURRENCY``, over the prompts of the file ``PROMPTS`` (one a line; no
dataset or tokenizer download).  Prints the summary ``benchmark()``
returns (its lists left out) and, per request, the fields that request
function filled in (observed by wrapping it; it runs unchanged).

``validate MODEL``: reads a JSON document on stdin and validates it with
the named pydantic model of 0.30's ``protocol/audio.py``; prints
``{"ok": true, "dump": ...}`` or ``{"ok": false, "errors": ...}``.

``request``: prints the JSON body 0.30's ``OpenAICreateSpeechRequest``
makes of the fields read on stdin (what a 0.30 client sends).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import vllm_omni
import vllm_omni.benchmarks.patch.patch as omni_patch
from pydantic import BaseModel, ValidationError
from vllm.benchmarks.datasets import SampleRequest
from vllm.benchmarks.lib.endpoint_request_func import ASYNC_REQUEST_FUNCS, RequestFuncInput
from vllm.benchmarks.serve import TaskType, get_first_model_from_server


def _load_audio_models() -> ModuleType:
    """0.30's ``protocol/audio.py`` (the request and response models), loaded
    from the installed wheel by its path: the ``protocol`` package's
    ``__init__`` imports the image and video servers (diffusers), which the
    benchmark client does not need; ``audio.py`` itself needs pydantic and
    numpy only."""
    path = Path(vllm_omni.__file__).parent / "entrypoints/openai/protocol/audio.py"
    spec = importlib.util.spec_from_file_location("omni_audio_protocol", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


omni_audio = _load_audio_models()

BACKEND = "openai-audio-speech"
#: the start of the line carrying the result
MARK = "OMNI-CLIENT-RESULT "
#: what ``vllm bench serve`` is given for a TTS run (its percentile metrics)
METRICS = ["e2el", "audio_ttfp", "audio_rtf", "audio_duration"]
#: the per-request fields the audio-speech request function fills in
OUTPUT_FIELDS = (
    "success",
    "error",
    "latency",
    "audio_ttfp",
    "audio_duration",
    "audio_frames",
    "audio_rtf",
    "audio_underrun_s",
    "audio_continuity_ok",
    "audio_underrun_event_count",
)


async def bench(base_url: str, concurrency: int, prompts: list[str]) -> dict[str, Any]:
    model_id, model_name = await get_first_model_from_server(base_url)
    request_func = ASYNC_REQUEST_FUNCS[BACKEND]
    outputs: list[Any] = []

    async def observed(
        request_func_input: RequestFuncInput, session: aiohttp.ClientSession, pbar: Any = None
    ) -> Any:
        output = await request_func(
            request_func_input=request_func_input, session=session, pbar=pbar
        )
        outputs.append(output)
        return output

    ASYNC_REQUEST_FUNCS[BACKEND] = observed
    try:
        requests = [
            SampleRequest(prompt=p, prompt_len=len(p.split()), expected_output_len=1)
            for p in prompts
        ]
        result = await omni_patch.benchmark(
            task_type=TaskType.GENERATION,
            endpoint_type=BACKEND,
            api_url=base_url + "/v1/audio/speech",
            base_url=base_url,
            model_id=model_id,
            model_name=model_name,
            tokenizer=None,
            input_requests=requests,
            logprobs=None,
            request_rate=float("inf"),
            burstiness=1.0,
            disable_tqdm=True,
            num_warmups=0,
            profile=False,
            selected_percentile_metrics=METRICS,
            selected_percentiles=[50.0, 99.0],
            ignore_eos=False,
            goodput_config_dict={},
            max_concurrency=concurrency,
            lora_modules=None,
            extra_headers=None,
            extra_body=None,
            ready_check_timeout_sec=10,
        )
    finally:
        ASYNC_REQUEST_FUNCS[BACKEND] = request_func
    summary = {k: v for k, v in result.items() if not isinstance(v, list)}
    # the first output is benchmark()'s initial single-prompt test run
    return {
        "model_id": model_id,
        "model_name": model_name,
        "summary": summary,
        "errors": result["errors"],
        "requests": [{f: getattr(o, f) for f in OUTPUT_FIELDS} for o in outputs[1:]],
        "ready_check": {f: getattr(outputs[0], f) for f in OUTPUT_FIELDS},
    }


def validate(model: str, document: Any) -> dict[str, Any]:
    cls = getattr(omni_audio, model)
    assert isinstance(cls, type) and issubclass(cls, BaseModel), model
    try:
        parsed = cls.model_validate(document)
    except ValidationError as exc:
        return {"ok": False, "errors": json.loads(exc.json())}
    return {"ok": True, "dump": parsed.model_dump(mode="json")}


def request(fields: dict[str, Any]) -> dict[str, Any]:
    parsed = omni_audio.OpenAICreateSpeechRequest.model_validate(fields)
    body: dict[str, Any] = parsed.model_dump(mode="json", exclude_unset=True)
    return body


def main(argv: list[str]) -> None:
    command = argv[1]
    if command == "bench":
        prompts = [line for line in Path(argv[4]).read_text().splitlines() if line.strip()]
        out = asyncio.run(bench(argv[2].rstrip("/"), int(argv[3]), prompts))
    elif command == "validate":
        out = validate(argv[2], json.load(sys.stdin))
    elif command == "request":
        out = request(json.load(sys.stdin))
    else:
        raise SystemExit(f"unknown command {command!r}")
    # benchmark() prints its tables on stdout too: the result is the marked line
    print(MARK + json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv)
