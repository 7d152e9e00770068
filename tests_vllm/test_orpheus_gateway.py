"""The gateway with ``engine = "orpheus"`` end to end, against the real vLLM.

Servers are real uvicorn servers on loopback: in-process ones (their state,
such as the decode worker's pending frames, is readable by the tests) and,
for the HTTP API, a ``python -m gateway serve`` process configured through
``GATEWAY_ENGINE=orpheus`` and ``GATEWAY_ORPHEUS_*``.  Clients are real
(``websockets``, a raw socket client that stops reading, the official
``openai`` SDK).

The tiny model speaks the same 60-frame chain for every segment (cut where
``max_tokens``, from the segment's length, is shorter): a segment's audio is
checked against SNAC's whole-utterance decode of those frames with the
segment's keyed-noise seed (the engine's counter, 1, 2, ... per engine).
The tiny model makes about 75 tokens/s on this CPU, below the 82 tokens/s of
real time, so nothing here asserts gap-free audio.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import soundfile as sf

from gateway.engines.orpheus.codes import SAMPLES_PER_FRAME
from gateway.engines.orpheus.completions import CompletionStream, Tokens
from gateway.engines.orpheus.engine import OrpheusEngine
from gateway.vocoders.snac_stream import decode_offline
from tests.conftest import RunningServer, run_server
from tests.helpers import Transcript, open_ws, recv_until, send, serve_process
from tests.http.helpers import metric
from tests.rawws import RawClient
from tests_vllm.conftest import (
    OfflineReference,
    VllmServer,
    orpheus_section,
    orpheus_settings,
    snr_db,
)
from tests_vllm.tiny_orpheus import TinyOrpheus

WS_CONFIG: dict[str, Any] = {
    "voice": "tara",
    "response_format": "pcm",
    "encoding": "pcm_f32le",
    "stream_audio": True,
    "frame_ms": 20,
    "split_granularity": "sentence",
}
#: three sentences, each long enough (>= 26 characters) for max_tokens to
#: allow the whole chain; the first keeps an emotion tag
SENTENCES = (
    "Hello <laugh> there, it is so good to hear from you again.",
    "The weather stayed warm and bright for the whole long weekend.",
    "Tell me everything that happened since we last spoke together.",
)
#: vLLM's per-request ``stream_interval`` for each sentence: its tokens
#: arrive 3, 7 and 1 at a time (3 is prime to 7, so its groups straddle
#: frame boundaries at every position).  The first sentence's read is never
#: held back (its audio goes out as it is decoded), so its groups are exactly 3
INTERVALS = dict(zip(SENTENCES, (3, 7, 1), strict=True))


@contextlib.contextmanager
def orpheus_server(
    vllm: VllmServer, snac: Path, orpheus: dict[str, Any] | None = None, **top: Any
) -> Iterator[RunningServer]:
    """An in-process gateway that starts (and closes) its own orpheus engine."""
    with run_server(orpheus_settings(vllm, snac, orpheus, **top), None) as server:
        deadline = time.monotonic() + 60
        while not server.state.engine.ready():
            assert time.monotonic() < deadline, "the orpheus engine never became ready"
            time.sleep(0.1)
        yield server


@pytest_asyncio.fixture(loop_scope="session")
async def idle_vllm(vllm_server: VllmServer) -> AsyncIterator[VllmServer]:
    """The vLLM, once no request of an earlier test runs on it any more."""
    await until(lambda: vllm_server.num_requests_running() == 0, 30)
    yield vllm_server


async def until(check: Callable[[], bool], limit_s: float, step_s: float = 0.05) -> float:
    """Poll ``check`` (in a thread: it may do blocking I/O) until true;
    returns the seconds it took."""
    start = time.monotonic()
    async with asyncio.timeout(limit_s):
        while not await asyncio.to_thread(check):
            await asyncio.sleep(step_s)
    return time.monotonic() - start


def segments(transcript: Transcript) -> list[tuple[dict[str, Any], np.ndarray]]:
    """Each ``audio.start`` event with the float32 samples that followed it."""
    out: list[tuple[dict[str, Any], list[bytes]]] = []
    for item in transcript.items:
        if isinstance(item, bytes):
            out[-1][1].append(item)
        elif item["type"] == "audio.start":
            out.append((item, []))
    return [(start, np.frombuffer(b"".join(parts), "<f4")) for start, parts in out]


async def test_a_streamed_reply_streams_audio_equal_to_the_offline_decode(
    idle_vllm: VllmServer,
    snac_folder: Path,
    offline: OfflineReference,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Text sent a few characters at a time; each sentence's tokens arrive 3,
    7 or 1 at a time from vLLM; the WebSocket audio of every sentence equals
    SNAC's offline decode of the model's 60 distinct frames (>= 60 dB)."""
    body = OrpheusEngine.completion_body

    def with_interval(self: OrpheusEngine, prompt: Any, text: str) -> dict[str, object]:
        return {**body(self, prompt, text), "stream_interval": INTERVALS[text]}

    arrivals: dict[int, list[int]] = {}  # id(CompletionStream) -> ids per event
    push = CompletionStream.push

    def recording(self: CompletionStream, data: bytes) -> Any:
        events = push(self, data)
        sizes = arrivals.setdefault(id(self), [])
        sizes.extend(len(e.ids) for e in events if isinstance(e, Tokens))
        return events

    monkeypatch.setattr(OrpheusEngine, "completion_body", with_interval)
    monkeypatch.setattr(CompletionStream, "push", recording)
    with orpheus_server(idle_vllm, snac_folder) as server:
        async with await open_ws(server.ws_url) as ws:
            created = json.loads(await ws.recv())
            assert created["capabilities"]["sample_rates"] == [24000]
            await send(ws, type="session.config", **WS_CONFIG)
            text = " ".join(SENTENCES)
            for i in range(0, len(text), 5):  # an LLM's reply, in small increments
                await send(ws, type="input.text", text=text[i : i + 5])
                await asyncio.sleep(0.01)
            await send(ws, type="input.done")
            transcript = await recv_until(ws, Transcript(), limit_s=240)
    assert transcript.of("error") == []
    done = transcript.of("session.done")[0]
    assert done["cancelled"] is False and done["total_sentences"] == 3
    spoken = segments(transcript)
    assert [start["sentence_text"] for start, _ in spoken] == list(SENTENCES)
    assert all(start["sample_rate"] == 24000 for start, _ in spoken)
    assert len(transcript.binary) > 3 * 200  # 20 ms frames as they were decoded
    seeds = set()
    for start, audio in spoken:
        assert audio.size == len(offline.frames) * SAMPLES_PER_FRAME, start
        seed, snr = offline.best_seed(audio, range(1, 4))
        print(f"{start['sentence_text'][:20]!r}: seed {seed}, streamed vs offline {snr:.1f} dB")
        assert snr >= 60
        seeds.add(seed)
    assert seeds == {1, 2, 3}
    assert len(set(offline.frames)) >= 50
    # how the token ids arrived: per event 1 (a stream's first token, and a
    # stream_interval of 1), 3 or 7, and more where vLLM merged the events a
    # held-back read had not taken yet (the later sentences' reads wait while
    # the first is heard); groups of 3 straddle frames
    sizes = {size for stream in arrivals.values() for size in stream}
    print("token ids per event:", sorted(sizes))
    assert {1, 3, 7} <= sizes


#: one sentence of three clauses (each >= 26 characters, so each item's
#: max_tokens allows the whole chain), over a 50-character item bound
LONG_SENTENCE = (
    "The river ran wide and slow past the mill,"
    " the children watched the boats drift by,"
    " and nobody wanted the summer to end."
)


async def test_a_long_segment_is_spoken_whole_in_items_within_the_bound(
    idle_vllm: VllmServer,
    snac_folder: Path,
    offline: OfflineReference,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bounded work per item: with ``orpheus.max_item_chars`` 50, a
    125-character segment is three completions of at most 50 characters
    each, in order, whose audio is one sentence equal to SNAC's offline
    decode of the three chains in a row (nothing lost at the seams); the
    bound is in ``session.created.limits`` and the largest item in
    ``gateway_engine_work_item_max``.  ``speed`` 1.5 is refused (Orpheus
    has no rate control: a session's config is refused whole)."""
    asked: list[str] = []
    body = OrpheusEngine.completion_body

    def recording(self: OrpheusEngine, prompt: Any, text: str) -> dict[str, object]:
        asked.append(text)
        return body(self, prompt, text)

    monkeypatch.setattr(OrpheusEngine, "completion_body", recording)
    with orpheus_server(idle_vllm, snac_folder, {"max_item_chars": 50}) as server:
        async with await open_ws(server.ws_url) as ws:
            await ws.recv()
            await send(ws, type="session.config", **WS_CONFIG, speed=1.5)
            refused = json.loads(await ws.recv())
            assert refused["type"] == "error" and refused["code"] == "unsupported_option"
            assert "`speed` 1.5" in refused["message"]
        async with await open_ws(server.ws_url) as ws:
            created = json.loads(await ws.recv())
            assert created["limits"]["max_work_item"] == 50
            assert created["limits"]["work_item_unit"] == "characters"
            config = {**WS_CONFIG, "split_granularity": "none"}  # one segment
            await send(ws, type="session.config", **config)
            await send(ws, type="input.text", text=LONG_SENTENCE)
            await send(ws, type="input.done")
            transcript = await recv_until(ws, Transcript(), limit_s=240)
        largest = await asyncio.to_thread(metric, server.http, "gateway_engine_work_item_max")
    assert transcript.of("error") == []
    [(start, audio)] = segments(transcript)
    assert start["sentence_text"] == LONG_SENTENCE
    assert len(asked) == 3 and " ".join(asked) == LONG_SENTENCE
    assert all(len(text) <= 50 for text in asked)
    assert largest == max(len(text) for text in asked) == 42  # the longest clause
    chains = offline.frames * 3
    assert audio.size == len(chains) * SAMPLES_PER_FRAME
    expected = decode_offline(offline.model, chains, "keyed", 1)
    snr = snr_db(expected, audio)
    print(f"three items as one stream vs the offline decode of three chains: {snr:.1f} dB")
    assert snr >= 60


async def test_cancel_aborts_the_vllm_requests_within_a_second(
    idle_vllm: VllmServer, snac_folder: Path
) -> None:
    """Barge-in: ``vllm:num_requests_running`` is back to 0 within 1 s.

    The cancel must find generations running: vLLM makes the two sentences'
    chains (about 5.6 s each) while their first audio is decoded, and on a
    loaded machine it may have finished both before the first frame reaches
    the client.  Such a try shows nothing about the cancel; it is repeated
    (up to three times), and one try must find them running."""
    for _ in range(3):
        await until(lambda: idle_vllm.num_requests_running() == 0, 30)
        with orpheus_server(idle_vllm, snac_folder) as server:
            async with await open_ws(server.ws_url) as ws:
                await ws.recv()
                await send(ws, type="session.config", **WS_CONFIG)
                await send(ws, type="input.text", text=" ".join(SENTENCES[:2]))
                await send(ws, type="input.done")
                while not isinstance(await ws.recv(), bytes):  # the first audio
                    pass
                running = await asyncio.to_thread(idle_vllm.num_requests_running)
                if running < 1:
                    print("vLLM had finished before the first audio; trying again")
                    continue
                await send(ws, type="cancel")
                took = await until(lambda: idle_vllm.num_requests_running() == 0, 5)
                print(f"{running:.0f} vLLM requests running at the cancel; 0 after {took:.2f} s")
                assert took <= 1.0
                transcript = await recv_until(ws, Transcript(), limit_s=30)
        break
    else:
        raise AssertionError("in three tries vLLM never still ran at the first audio")
    assert transcript.of("audio.cancelled")
    assert transcript.of("session.done")[0]["cancelled"] is True
    assert transcript.of("error") == []


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_a_stalled_listener_holds_the_decode_and_memory(
    idle_vllm: VllmServer, snac_folder: Path, tiny_model: TinyOrpheus
) -> None:
    """A client that stops reading after its first audio frame (4 KiB receive
    buffer): once vLLM has generated both sentences in full, the gateway's
    decode has stopped short of them, each segment holds at most about
    ``max_pending_frames`` undecoded frames (the HTTP read waits; the rest
    stays in vLLM and TCP buffers).  Those counts are the bound's evidence: a
    whole segment's audio is only 0.5 MB, so RSS cannot tell a bounded decode
    from an unbounded one here; it is printed, not asserted (measured from
    the first frame it includes the decode path's first allocations for each
    batch shape: 0.3 to 51 MB in runs here).  Closing the client frees the
    session and its jobs."""
    max_pending = 8
    with orpheus_server(
        idle_vllm, snac_folder, {"max_pending_frames": max_pending}, stall_timeout_s=60.0
    ) as server:
        engine = server.state.engine
        assert isinstance(engine, OrpheusEngine) and engine.worker is not None
        worker = engine.worker
        client = RawClient(server.ws_url, rcvbuf=4096)
        await client.connect()
        try:
            assert isinstance(await client.recv(), dict)  # session.created
            config = {**WS_CONFIG, "encoding": "pcm_s16le"}
            await client.send_json(type="session.config", **config)
            await client.send_json(type="input.text", text=" ".join(SENTENCES[:2]))
            await client.send_json(type="input.done")
            while not isinstance(await client.recv(), bytes):  # the first audio frame
                pass
            rss_before = _rss_bytes()

            def decoded() -> tuple[int, ...]:
                with worker.cond:
                    return tuple(s.samples for s in worker._streams)

            # the client reads nothing more; vLLM generates both sentences
            # (its requests end although the gateway has not read them all)
            await until(lambda: idle_vllm.num_requests_running() == 0, 90, step_s=0.2)
            held = await _until_stable(decoded, quiet_s=2.0, limit_s=60)
            with worker.cond:
                pending = [len(s.pending) for s in worker._streams]
            chain = len(tiny_model.frames) * SAMPLES_PER_FRAME
            growth = _rss_bytes() - rss_before
            print(f"stalled: decoded {held} of {chain} samples each, pending {pending} frames")
            print(f"stalled: rss +{growth / 1e6:.1f} MB")
            assert len(held) == 2 and sum(held) < 2 * chain  # the decode stopped short
            assert all(p <= 2 * max_pending for p in pending)
            assert decoded() == held
        finally:
            client.close()
        await until(lambda: not server.state.live_sessions, 30)
        await until(lambda: engine.live_jobs() == 0, 10)


async def _until_stable(read: Callable[[], Any], quiet_s: float, limit_s: float) -> Any:
    value, since = read(), time.monotonic()
    async with asyncio.timeout(limit_s):
        while time.monotonic() - since < quiet_s:
            await asyncio.sleep(0.1)
            now = read()
            if now != value:
                value, since = now, time.monotonic()
    return value


async def test_a_vllm_restart_fails_the_segment_and_the_session_goes_on(
    idle_vllm: VllmServer, snac_folder: Path, offline: OfflineReference
) -> None:
    """vLLM is killed mid-segment: that segment fails with a stable error code
    (``internal``, partial audio, ``discard``: vllm-omni 0.30's action for a
    sentence whose partial audio the client drops), the session stays
    open, and once vLLM is back the next text is spoken in full.

    The kill must find the generation running: on a loaded machine vLLM may
    have made the whole chain before the first frame reaches the client (CI
    saw it once), and killing it then fails nothing.  Such a try is spoken
    to its end and repeated (up to three times); one try must find it
    running.  Every try takes the engine's next seed, so the segment spoken
    after the restart has seed ``tries + 1``.  vLLM is started again whatever
    happens, so a failure here does not take the server from the tests after
    it."""
    try:
        with orpheus_server(idle_vllm, snac_folder, idle_timeout_s=600.0) as server:
            async with await open_ws(server.ws_url) as ws:
                await ws.recv()
                await send(ws, type="session.config", **WS_CONFIG)
                for tries in range(1, 4):
                    await until(lambda: idle_vllm.num_requests_running() == 0, 30)
                    await send(ws, type="input.text", text=SENTENCES[0])
                    await send(ws, type="input.done")
                    while not isinstance(await ws.recv(), bytes):
                        pass
                    if await asyncio.to_thread(idle_vllm.num_requests_running) >= 1:
                        break
                    print(f"try {tries}: vLLM had finished before the first audio; trying again")
                    await recv_until(ws, Transcript(), limit_s=60)
                else:
                    raise AssertionError("in three tries vLLM never still ran at the first audio")
                await asyncio.to_thread(idle_vllm.stop, True)  # killed, engine and all
                failed = await recv_until(ws, Transcript(), limit_s=60)
                errors = failed.of("error")
                assert [e["code"] for e in errors] == ["internal"]
                assert errors[0]["fatal"] is False
                assert errors[0]["partial_audio"] is True
                assert errors[0]["action"] == "discard"
                assert "127.0.0.1" not in errors[0]["message"]  # no addresses in errors
                assert failed.of("audio.done")[0]["error"] is True
                started = time.monotonic()
                await asyncio.to_thread(idle_vllm.start)
                print(f"vLLM restarted in {time.monotonic() - started:.1f} s")
                await until(server.state.engine.ready, 30)
                await send(ws, type="input.text", text=SENTENCES[1])
                await send(ws, type="input.done")
                spoken = await recv_until(ws, Transcript(), limit_s=120)
    finally:
        if idle_vllm.proc is None:
            await asyncio.to_thread(idle_vllm.start)
    assert spoken.of("error") == []
    [(start, audio)] = segments(spoken)
    assert start["sentence_text"] == SENTENCES[1]
    # Each try took the engine's next seed (1, 2, ...); the one after is this segment's.
    seed, snr = offline.best_seed(audio, range(1, 6))
    assert seed == tries + 1 and snr >= 60


def test_the_http_api_speaks_with_the_orpheus_engine(
    vllm_server: VllmServer,
    snac_folder: Path,
    offline: OfflineReference,
    tmp_path: Path,
) -> None:
    """``python -m gateway serve`` configured by ``GATEWAY_ENGINE=orpheus``
    and ``GATEWAY_ORPHEUS_*``; the official OpenAI SDK's speech request."""
    from openai import OpenAI

    section = orpheus_section(vllm_server, snac_folder)
    env = {f"orpheus_{key}": value for key, value in section.items() if key != "urls"}
    with serve_process(
        tmp_path, engine="orpheus", orpheus_urls=vllm_server.base_url, **env
    ) as proc:
        client = OpenAI(base_url=proc.base + "/v1", api_key="unused", max_retries=0, timeout=120)
        response = client.audio.speech.create(
            model="tts-1", voice="tara", input=SENTENCES[2], response_format="wav"
        )
        audio, rate = sf.read(io.BytesIO(response.content), dtype="float32")
    assert rate == 24000
    _, snr = offline.best_seed(np.asarray(audio, np.float32), range(1, 2))
    print(f"HTTP speech vs offline decode: {snr:.1f} dB (16-bit WAV)")
    assert snr >= 40  # 16-bit samples: quantisation bounds the SNR
