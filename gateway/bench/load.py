"""Load scenarios of ``python -m gateway bench``: ``http-load`` and ``overload``.

* ``http-load``: vllm-omni's serving benchmark for TTS, reproduced: streamed
  PCM requests with its payload (0.30's ``openai-audio-speech``: ``{"input",
  "stream": true, "stream_format": "audio", "response_format": "pcm"}``, and
  a ``voice``, which 0.30's leaves to the server's default) at
  each of ``--http-levels`` concurrencies, ``--http-requests`` requests per
  level.  TTFP (time to first packet) is from sending the request to the first
  body byte, so a wait in the admission queue is in it.  Every status other
  than 200 is a failure (503 ``busy`` counted apart).
* ``overload``: ``--overload-sessions`` LLM-paced sessions (about twice
  capacity) arriving within ``--overload-arrival-s`` from
  ``--overload-addresses`` loopback addresses ``127.0.0.x`` (so admission's
  round-robin across clients is exercised), each speaking one reply.  Reports
  the admitted sessions' gaps, the ``busy`` answers with their retry advice
  and when they came, any other error, and the server's RSS at idle before,
  right after and ``--overload-settle-s`` after.

Both print JSON lines through the runner's sink: ``http_request`` and an
``http_load`` summary per level; ``overload_session`` per session and one
``overload`` summary.  This module measures;
``gateway.bench.measure`` interprets the audio.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.bench import corpus
from gateway.bench.drivers import GatewayUser, Pacing, Record
from gateway.bench.measure import summarize


#: vllm-omni 0.30's benchmark payload (``benchmarks/patch/patch.py``,
#: ``async_request_openai_audio_speech``): ``stream: true`` alone is SSE in
#: 0.30, so it names the raw stream with ``stream_format: "audio"``
def vllm_omni_payload(text: str, voice: str = "joe") -> dict[str, Any]:
    return {
        "input": text,
        "stream": True,
        "stream_format": "audio",
        "response_format": "pcm",
        "voice": voice,
    }


async def _one_request(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    first: float | None = None
    size = 0
    status = 0
    retry_after: str | None = None
    error: str | None = None
    try:
        async with client.stream("POST", url, json=body) as response:
            status = response.status_code
            retry_after = response.headers.get("retry-after")
            async for chunk in response.aiter_bytes():
                if chunk and first is None:
                    first = time.perf_counter()
                size += len(chunk)
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    return {
        "status": status,
        "ttfp_ms": None if first is None or status != 200 else round((first - start) * 1e3, 2),
        "e2e_ms": round((end - start) * 1e3, 2),
        "bytes": size,
        "retry_after": retry_after,
        "error": error,
    }


async def http_load(
    http_base: str,
    levels: list[int],
    requests_per_level: int,
    seed: int,
    voice: str = "joe",
    timeout_s: float = 120.0,
) -> list[dict[str, Any]]:
    """Each level: ``requests_per_level`` requests, ``level`` in flight at once."""
    url = http_base.rstrip("/") + "/v1/audio/speech"
    lines: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=max(levels), max_keepalive_connections=max(levels))
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        for level in levels:
            rng = random.Random(f"{seed}:http-load:{level}")
            texts = [rng.choice(corpus.SENTENCES) for _ in range(requests_per_level)]
            gate = asyncio.Semaphore(level)

            async def one(text: str, gate: asyncio.Semaphore = gate) -> dict[str, Any]:
                async with gate:
                    return await _one_request(client, url, vllm_omni_payload(text, voice))

            started = time.perf_counter()
            results = await asyncio.gather(*(one(t) for t in texts))
            wall = time.perf_counter() - started
            for i, r in enumerate(results):
                lines.append(
                    {
                        "kind": "http_request",
                        "scenario": "http-load",
                        "level": level,
                        "index": i,
                        **r,
                    }
                )
            ok = [r for r in results if r["status"] == 200 and r["error"] is None]
            lines.append(
                {
                    "kind": "http_load",
                    "target": "gateway",
                    "scenario": "http-load",
                    "level": level,
                    "requests": len(results),
                    "failed": len(results) - len(ok),
                    "busy_503": sum(1 for r in results if r["status"] == 503),
                    "other_failures": sorted(
                        {
                            f"{r['status']} {r['error'] or ''}".strip()
                            for r in results
                            if r not in ok and r["status"] != 503
                        }
                    ),
                    "ttfp_ms": summarize(r["ttfp_ms"] for r in ok),
                    "e2e_ms": summarize(r["e2e_ms"] for r in ok),
                    "wall_s": round(wall, 2),
                }
            )
    return lines


def rss_mib(pid: int | None) -> float | None:
    """The resident set of a process, from ``/proc`` (None elsewhere)."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


async def overload_records(
    ws_url: str,
    *,
    sessions: int,
    arrival_s: float,
    addresses: int,
    pacing: Pacing,
    seed: int,
    voice: str | None = None,
) -> list[Record]:
    """The overload scenario's sessions as their clients saw them:
    ``sessions`` users arriving within ``arrival_s`` from ``addresses``
    loopback addresses, one reply each (``bench/overload_timeline.py`` reads
    them whole)."""
    rng = random.Random(f"{seed}:overload")
    texts = [rng.choice(corpus.PARAGRAPHS) for _ in range(sessions)]
    arrivals = sorted(rng.uniform(0, arrival_s) for _ in range(sessions))

    async def one(i: int) -> Record:
        await asyncio.sleep(arrivals[i])
        host = f"127.0.0.{1 + i % max(1, addresses)}"
        record = Record("gateway", "overload", sessions, i, 0, texts[i])
        user = GatewayUser(ws_url, voice, local_host=host)
        try:
            await user.open()
            urng = random.Random(f"{seed}:overload:{i}")
            return await user.utterance(record, pacing, urng, None)
        except Exception as exc:  # a refused or failed connection is a result here
            record.error = f"connect: {type(exc).__name__}: {exc}"
            return record
        finally:
            await user.close()

    return list(await asyncio.gather(*(one(i) for i in range(sessions))))


async def overload(
    ws_url: str,
    *,
    sessions: int,
    arrival_s: float,
    addresses: int,
    pacing: Pacing,
    seed: int,
    prebuffer_ms: float,
    server_pid: int | None,
    settle_s: float,
    voice: str | None = None,
) -> list[dict[str, Any]]:
    """``sessions`` users arriving within ``arrival_s``, one reply each."""
    rss_idle = rss_mib(server_pid)
    records = await overload_records(
        ws_url,
        sessions=sessions,
        arrival_s=arrival_s,
        addresses=addresses,
        pacing=pacing,
        seed=seed,
        voice=voice,
    )
    rss_after = rss_mib(server_pid)
    measures = [r.measures(prebuffer_ms) for r in records]
    admitted = [m for m in measures if not m["error"]]
    busy = [m for m in measures if m.get("busy")]
    other = [m for m in measures if m["error"] and not m.get("busy")]
    if settle_s > 0:
        await asyncio.sleep(settle_s)
    rss_settled = rss_mib(server_pid)
    lines: list[dict[str, Any]] = [
        {**m, "kind": "overload_session", "address_index": m["user"] % max(1, addresses)}
        for m in measures
    ]
    lines.append(
        {
            "kind": "overload",
            "target": "gateway",
            "scenario": "overload",
            "level": sessions,
            "arrival_s": arrival_s,
            "addresses": addresses,
            "admitted": len(admitted),
            "admitted_with_gap": sum(1 for m in admitted if (m.get("max_gap_ms") or 0) > 100),
            "admitted_underruns": sum(m.get("underruns", 0) for m in admitted),
            "ttfa_first_token_ms": summarize(m["ttfa_first_token_ms"] for m in admitted),
            "busy": len(busy),
            "busy_with_retry_advice": sum(1 for m in busy if m.get("retry_after_ms")),
            "busy_answered_after_first_text_ms": summarize(
                m["answered_after_first_text_ms"] for m in busy
            ),
            # the server's own count, from the refused text's commit (its
            # first cut): what the queue deadline bounds
            "busy_queue_waited_ms": summarize(m.get("queue_waited_ms") for m in busy),
            "busy_refused_at_once": sum(1 for m in busy if m.get("queue_waited_ms") is None),
            # the door answers before any audio: a refusal after audio would
            # be a conversation cut for capacity
            "busy_after_audio": sum(1 for m in busy if m.get("bytes")),
            "other_errors": sorted({str(m["error"])[:120] for m in other}),
            "rss_mib": {
                "idle_before": rss_idle,
                "after": rss_after,
                f"after_{settle_s:g}s": rss_settled,
            },
        }
    )
    return lines
