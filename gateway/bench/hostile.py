"""The ``hostile`` scenario of ``python -m gateway bench``: a canary beside
the worst text a neighbour can send (issue 28).

``--hostile-rounds`` (2) rounds of two phases of ``--hostile-phase-s``
seconds each, on one server, benign then hostile (alternating, so that
this machine's drifting speed hits both): a **neighbour** client sends, at once, on two WebSocket
sessions and one HTTP request,

* ``alias``: ``pronunciations {"qq": <300 characters>}`` and
  ``"qq " * 10 + "end."`` (one sentence, 3,014 engine characters);
* ``numbers``: ``"777,777,777,777,777 " * 9 + "end."`` (1,570 engine
  characters);
* ``http``: ``POST /v1/audio/speech`` with ``("*a " * 7000)[:19990]``
  (espeak reads each ``*`` as "asterisk");

and in the ``benign`` phase the same three with ordinary prose of the same
engine length (the corpus's sentences).  The neighbour reads everything as
fast as it comes (no flow control: the engine runs flat out for it) and
leaves when the phase ends.  Meanwhile a **canary** session says "Hello
there, canary here." and ``input.done`` every ``--hostile-every-s`` seconds
(3).

Reported per phase and round (``hostile_round`` lines) and pooled per
phase (``hostile`` lines): the canary's first audio from its
``input.done`` (p50, p95, max), its largest playout gap (``max_gap_ms``,
``gateway.bench.measure``), its errors; the server's RSS at idle before
the phase and its peak during it (sampled every 250 ms; needs the server's
pid: started here, or ``--server-pid``); the largest engine work item
(``gateway_engine_work_item_max`` from ``/metrics``, with the bound the
server declares in ``session.created.limits``; null where a server has
neither).  A ``hostile_verdict`` line checks the issue's targets: canary
first audio p95 within x1.5 of the benign phase's plus 150 ms, no canary
gap over 100 ms, peak RSS at most idle + 300 MB, no work item over the
bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from typing import Any

import httpx

from gateway.bench import corpus
from gateway.bench.drivers import GatewayUser, Pacing, Record
from gateway.bench.load import rss_mib
from gateway.bench.measure import summarize
from gateway.client import Client, Disconnected
from gateway.protocol import SessionConfig

CANARY = "Hello there, canary here."
ALIAS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu " * 3
)[:300].strip()
ALIAS_TEXT = "qq " * 10 + "end."
NUMBERS_TEXT = "777,777,777,777,777 " * 9 + "end."
STAR_TEXT = ("*a " * 7000)[:19990]
#: the engine text of each hostile input (measured with the front-end:
#: docs/text.md), which its benign twin matches in prose
ENGINE_CHARS = {"alias": 3014, "numbers": 1570, "http": 19916}
#: the issue's targets
FIRST_AUDIO_FACTOR = 1.5
FIRST_AUDIO_SLACK_MS = 150.0
GAP_MS = 100.0
RSS_HEADROOM_MIB = 300.0


def prose(chars: int, seed: str) -> str:
    """Ordinary sentences from the corpus, about ``chars`` characters."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < chars:
        sentence = rng.choice(corpus.SENTENCES)
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)[:chars].rsplit(" ", 1)[0] + "."


def neighbour_inputs(phase: str) -> dict[str, tuple[str, dict[str, str]]]:
    """What the neighbour sends in ``phase``: name -> (text, pronunciations)."""
    if phase == "hostile":
        return {
            "alias": (ALIAS_TEXT, {"qq": ALIAS}),
            "numbers": (NUMBERS_TEXT, {}),
            "http": (STAR_TEXT, {}),
        }
    return {name: (prose(n, f"benign:{name}"), {}) for name, n in ENGINE_CHARS.items()}


async def _ws_neighbour(
    url: str, text: str, pronunciations: dict[str, str], stop: asyncio.Event
) -> dict[str, Any]:
    """One neighbour session: the text, read as fast as it comes, until
    ``stop`` (then it leaves)."""
    config = SessionConfig(
        response_format="pcm", stream_audio=True, pronunciations=pronunciations or None
    )
    started = time.monotonic()
    first: float | None = None
    frames = 0
    errors: list[str] = []
    async with await Client.connect(url, config) as client:
        await client.send_text(text)
        await client.done()
        while not stop.is_set():
            try:
                event = await client.next_event(0.25)
            except TimeoutError:
                continue
            kind = type(event).__name__
            if kind == "AudioFrame":
                frames += 1
                first = first or time.monotonic()
            elif kind == "Error":
                errors.append(getattr(event, "code", "?"))
            elif kind == "SessionDone" or isinstance(event, Disconnected):
                break
    return {
        "first_audio_ms": None if first is None else round((first - started) * 1e3, 1),
        "frames": frames,
        "errors": errors,
    }


async def _http_neighbour(base: str, text: str, stop: asyncio.Event) -> dict[str, Any]:
    body = {"input": text, "voice": "joe", "response_format": "pcm"}
    started = time.monotonic()
    first: float | None = None
    size = 0
    status = 0
    async with httpx.AsyncClient(timeout=None) as client:
        with contextlib.suppress(httpx.HTTPError):
            async with client.stream("POST", base + "/v1/audio/speech", json=body) as response:
                status = response.status_code
                async for chunk in response.aiter_bytes():
                    if chunk and first is None:
                        first = time.monotonic()
                    size += len(chunk)
                    if stop.is_set():
                        break
    return {
        "status": status,
        "first_byte_ms": None if first is None else round((first - started) * 1e3, 1),
        "bytes": size,
    }


async def _canary(
    url: str, every_s: float, count: int, voice: str | None, prebuffer_ms: float
) -> list[dict[str, Any]]:
    user = GatewayUser(url, voice)
    await user.open()
    measures: list[dict[str, Any]] = []
    try:
        begin = time.monotonic()
        for i in range(count):
            if i and time.monotonic() > begin + count * every_s:
                break  # the phase is over (a stalled server: fewer canaries)
            await asyncio.sleep(max(0.0, begin + i * every_s - time.monotonic()))
            record = Record("gateway", "hostile", 1, 0, i, CANARY)
            record = await user.utterance(
                record, Pacing(streamed=False), random.Random(i), cancel_after_s=None
            )
            measures.append(record.measures(prebuffer_ms))
    finally:
        await user.close()
    return measures


async def _work_item(base: str) -> float | None:
    """The largest engine work item the server has run (None: not exported)."""
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(base + "/metrics")).text
    match = re.search(r"^gateway_engine_work_item_max ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


async def _limits(url: str) -> dict[str, Any]:
    async with await Client.connect(url, SessionConfig(response_format="pcm")) as client:
        created = client.session
    if created is None:
        return {}
    limits = created.limits
    return {
        "max_work_item": getattr(limits, "max_work_item", None),
        "work_item_unit": getattr(limits, "work_item_unit", None),
    }


async def _sample_rss(pid: int | None, stop: asyncio.Event, peak: list[float]) -> None:
    while not stop.is_set():
        rss = rss_mib(pid)
        if rss is not None:
            peak[0] = max(peak[0], rss)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


async def _phase(
    phase: str,
    ws_url: str,
    http_base: str,
    *,
    phase_s: float,
    every_s: float,
    server_pid: int | None,
    voice: str | None,
    prebuffer_ms: float,
    settle_s: float,
) -> list[dict[str, Any]]:
    rss_idle = rss_mib(server_pid)
    stop = asyncio.Event()
    peak = [rss_idle or 0.0]
    sampler = asyncio.create_task(_sample_rss(server_pid, stop, peak))
    inputs = neighbour_inputs(phase)
    neighbours = {
        name: asyncio.create_task(
            _http_neighbour(http_base, text, stop)
            if name == "http"
            else _ws_neighbour(ws_url, text, prons, stop)
        )
        for name, (text, prons) in inputs.items()
    }
    await asyncio.sleep(0.5)  # the neighbour's work is under way
    count = max(1, int(phase_s // every_s))
    canary = await _canary(ws_url, every_s, count, voice, prebuffer_ms)
    stop.set()
    results = {name: await task for name, task in neighbours.items()}
    await sampler
    await asyncio.sleep(settle_s)  # the neighbour's cancelled work drains
    item = await _work_item(http_base)
    lines: list[dict[str, Any]] = [{**m, "kind": "hostile_canary", "phase": phase} for m in canary]
    lines.append(
        {
            **_canary_summary(canary),
            "kind": "hostile_round",
            "phase": phase,
            "rss_idle_mib": rss_idle,
            "rss_peak_mib": peak[0] if rss_idle is not None else None,
            "largest_work_item": item,
            "neighbour": {
                name: {**r, "input_chars": len(inputs[name][0])} for name, r in results.items()
            },
        }
    )
    return lines


def _canary_summary(canary: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [m for m in canary if not m.get("error")]
    return {
        "canary_utterances": len(canary),
        "canary_errors": len(canary) - len(ok),
        "canary_first_audio_ms": summarize(m.get("ttfa_flush_ms") for m in ok),
        "canary_max_gap_ms": max((m.get("max_gap_ms") or 0.0 for m in ok), default=None),
        "canary_utterances_with_gap": sum(1 for m in ok if (m.get("max_gap_ms") or 0) > GAP_MS),
    }


def verdict(benign: dict[str, Any], hostile: dict[str, Any], bound: Any) -> dict[str, Any]:
    """The issue's targets, checked on the two phases' summaries."""
    b95 = benign["canary_first_audio_ms"]["p95"]
    h95 = hostile["canary_first_audio_ms"]["p95"]
    allowed = None if b95 is None else round(b95 * FIRST_AUDIO_FACTOR + FIRST_AUDIO_SLACK_MS, 1)
    rss_ok = None
    if hostile["rss_idle_mib"] is not None and hostile["rss_peak_mib"] is not None:
        rss_ok = hostile["rss_peak_mib"] <= benign["rss_idle_mib"] + RSS_HEADROOM_MIB
    item = hostile["largest_work_item"]
    return {
        "kind": "hostile_verdict",
        "canary_first_audio_p95_ms": {"benign": b95, "hostile": h95, "allowed": allowed},
        "first_audio_ok": None if allowed is None or h95 is None else h95 <= allowed,
        "gap_ok": (hostile["canary_max_gap_ms"] or 0.0) <= GAP_MS,
        "rss_ok": rss_ok,
        "rss_growth_mib": (
            None
            if hostile["rss_peak_mib"] is None or benign["rss_idle_mib"] is None
            else round(hostile["rss_peak_mib"] - benign["rss_idle_mib"], 1)
        ),
        "largest_work_item": item,
        "work_item_bound": bound,
        "work_item_ok": None if item is None or bound is None else item <= bound,
        "canary_errors": benign["canary_errors"] + hostile["canary_errors"],
    }


async def hostile(
    ws_url: str,
    http_base: str,
    *,
    phase_s: float,
    every_s: float,
    server_pid: int | None,
    rounds: int = 2,
    voice: str | None = None,
    prebuffer_ms: float = 0.0,
    settle_s: float = 5.0,
) -> list[dict[str, Any]]:
    """``rounds`` of both phases, benign first, alternating (this machine's
    speed drifts: pooled over alternating rounds, a drift hits both), then
    one ``hostile`` summary per phase and the verdict."""
    limits = await _limits(ws_url)
    lines: list[dict[str, Any]] = [{"kind": "hostile_limits", **limits}]
    rss_idle = rss_mib(server_pid)
    canaries: dict[str, list[dict[str, Any]]] = {"benign": [], "hostile": []}
    rounds_of: dict[str, list[dict[str, Any]]] = {"benign": [], "hostile": []}
    for _ in range(max(1, rounds)):
        for phase in ("benign", "hostile"):
            phase_lines = await _phase(
                phase,
                ws_url,
                http_base,
                phase_s=phase_s,
                every_s=every_s,
                server_pid=server_pid,
                voice=voice,
                prebuffer_ms=prebuffer_ms,
                settle_s=settle_s,
            )
            lines.extend(phase_lines)
            canaries[phase] += [m for m in phase_lines if m["kind"] == "hostile_canary"]
            rounds_of[phase].append(phase_lines[-1])
    summaries: dict[str, dict[str, Any]] = {}
    for phase, canary in canaries.items():
        peaks = [r["rss_peak_mib"] for r in rounds_of[phase] if r["rss_peak_mib"] is not None]
        summaries[phase] = {
            **_canary_summary(canary),
            "kind": "hostile",
            "phase": phase,
            "rounds": len(rounds_of[phase]),
            "rss_idle_mib": rss_idle,
            "rss_peak_mib": max(peaks) if peaks else None,
            "largest_work_item": rounds_of[phase][-1]["largest_work_item"],
        }
        lines.append(summaries[phase])
    lines.append(verdict(summaries["benign"], summaries["hostile"], limits.get("max_work_item")))
    return lines
