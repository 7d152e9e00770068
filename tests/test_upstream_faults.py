"""The upstream relay against replicas that answer wrongly: a real gateway
in ``upstream`` mode (in-process, real uvicorn) in front of
``tests/faultreplica.py`` replicas (real HTTP servers on loopback that
answer a proxy's error page, an endless or trickling body, a lying
``X-Sample-Rate``, 429/503, leaky error texts).  Each test here failed
before the relay checked, bounded and reported these (issue 23).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.engines.upstream.engine import UpstreamEngine
from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as settings_for
from tests.faultproxy import FaultProxy, Faults
from tests.faultreplica import LEAK, RATE, FaultReplica, fault_replica, tone
from tests.helpers import Transcript, open_ws, recv_until, send, serve_process

STREAM = {"response_format": "pcm", "stream_audio": True, "frame_ms": 20}
#: no probes: every request a test makes is a speech request
PASSIVE = {"health_path": "", "ready_paths": [], "native_rate": RATE, "voices": ["tone"]}
TEXT = "Hello there."
#: what a leaky replica's error text must never pass on
SECRETS = ("hunter2", "admin:", "10.1.2.3", "sk-live", "token=abc")


@contextmanager
def front(urls: list[str], **upstream: Any) -> Iterator[RunningServer]:
    config = {"urls": urls, "cooldown_s": 30.0, "send_sample_rate": True, **PASSIVE, **upstream}
    with run_server(settings_for(engine="upstream", upstream=config), None) as server:
        yield server


@contextmanager
def replicas(*modes: str, **options: Any) -> Iterator[list[FaultReplica]]:
    with ExitStack() as stack:
        yield [stack.enter_context(fault_replica(speech=m, **options)) for m in modes]


def engine_of(server: RunningServer) -> UpstreamEngine:
    engine = server.state.engine
    assert isinstance(engine, UpstreamEngine)
    return engine


async def speech(base: str, text: str = TEXT, **extra: Any) -> httpx.Response:
    body = {"input": text, "voice": "tone", "response_format": "pcm", "sample_rate": RATE, **extra}
    async with asyncio.timeout(20), httpx.AsyncClient(timeout=20) as client:
        return await client.post(base + "/v1/audio/speech", json=body)


async def session(gw: RunningServer, text: str = TEXT) -> Transcript:
    async with asyncio.timeout(20), await open_ws(gw.ws_url) as ws:
        await ws.recv()
        await send(ws, type="session.config", sample_rate=RATE, **STREAM)
        await send(ws, type="input.text", text=text)
        await send(ws, type="input.done")
        return await recv_until(ws, Transcript())


def audio_of(t: Transcript) -> int:
    """Bytes of PCM a transcript's binary frames carried (header stripped)."""
    return sum(len(b) - len(b) % 2 for b in t.binary) if t.binary else 0


async def settled(gw: RunningServer, *faulty: FaultReplica) -> None:
    """Every replica slot given back and every replica body ended."""
    pool = engine_of(gw).client.pool
    async with asyncio.timeout(5):
        while any(r.outstanding for r in pool.replicas) or any(f.open_bodies for f in faulty):
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("mode", ["html", "json", "rate"])
async def test_a_body_that_is_not_audio_is_retried_and_never_relayed(mode: str) -> None:
    """A ``200 text/html`` page, a ``200`` JSON error, ``X-Sample-Rate: 1000``."""
    want = len(tone(0.06 * len(TEXT)))
    with replicas(mode, "ok") as (bad, good), front([bad.base, good.base]) as gw:
        for _ in range(3):
            got = await speech(gw.http)
            assert got.status_code == 200
            assert abs(len(got.content) - want) <= 4  # the good replica's audio, nothing else
        t = await session(gw)
        assert not t.of("error") and abs(audio_of(t) - want) < 2048
        assert bad.speech_requests >= 1  # it was asked, and failed over
        failures = engine_of(gw).client.pool.replicas[0].failures
        assert failures.get("body", 0) >= 1


@pytest.mark.parametrize("mode", ["html", "json", "rate"])
async def test_a_pool_answering_no_audio_fails_with_a_documented_code(mode: str) -> None:
    with replicas(mode) as (bad,), front([bad.base]) as gw:
        got = await speech(gw.http)
        assert got.status_code == 500 and got.json()["error"]["code"] == "internal"
        assert "not speech audio" in got.json()["error"]["message"]
        t = await session(gw)
        (error,) = t.of("error")
        assert error["code"] == "internal" and error["partial_audio"] is False
        assert not t.binary or audio_of(t) == 0


async def test_an_endless_body_is_capped_relative_to_its_text() -> None:
    with replicas("endless") as (endless,), front([endless.base]) as gw:
        cap = engine_of(gw).client.audio_cap({"input": "Hi."})
        t = await session(gw, "Hi.")
        (error,) = t.of("error")
        assert error["partial_audio"] is True and "max_audio_base_s" in error["message"]
        assert audio_of(t) <= cap * RATE * 2 + 4096  # no more than the cap was relayed
        await settled(gw, endless)  # the replica slot and the replica's body are freed
        assert engine_of(gw).live_jobs() == 0  # and the stream's job
        got = 0  # HTTP: the body is cut short after the cap
        body = {"input": "Hi.", "voice": "tone", "response_format": "pcm", "sample_rate": RATE}
        async with (
            asyncio.timeout(20),
            httpx.AsyncClient(timeout=20) as client,
            client.stream("POST", gw.http + "/v1/audio/speech", json=body) as response,
        ):
            with pytest.raises(httpx.RemoteProtocolError):
                async for piece in response.aiter_raw():
                    got += len(piece)
        assert 0 < got <= cap * RATE * 2 + 4096


async def test_a_trickling_replica_fails_below_the_minimum_rate() -> None:
    with (
        replicas("trickle") as (slow,),
        front([slow.base], min_delivery_grace_s=0.5) as gw,
    ):
        t = await session(gw)
        (error,) = t.of("error")
        assert error["partial_audio"] is True and "min_delivery_rate" in error["message"]
        await settled(gw, slow)
        assert engine_of(gw).live_jobs() == 0
        assert engine_of(gw).client.pool.replicas[0].failures.get("slow") == 1


async def test_a_segment_past_its_deadline_fails() -> None:
    with (
        replicas("trickle") as (slow,),
        front(
            [slow.base], min_delivery_rate=0, first_byte_timeout_s=0.5, segment_timeout_s=1.0
        ) as gw,
    ):
        t = await session(gw)
        (error,) = t.of("error")
        assert error["partial_audio"] is True and "segment_timeout_s" in error["message"]
        await settled(gw, slow)
        assert engine_of(gw).client.pool.replicas[0].failures.get("deadline") == 1


async def test_a_first_byte_wait_longer_than_the_read_timeout_is_kept() -> None:
    """``first_byte_timeout_s`` is the first byte's bound even where
    ``read_timeout_s`` is shorter: a replica silent for 1 s before its answer
    (read timeout 0.3 s) is waited for, not abandoned and retried."""
    with replicas("ok") as (only,), ExitStack() as stack:
        proxy = stack.enter_context(_closing(FaultProxy(only.port)))
        proxy.faults = Faults(delay_s=1.0)
        gw = stack.enter_context(front([proxy.url], read_timeout_s=0.3, first_byte_timeout_s=30.0))
        got = await speech(gw.http)
        assert got.status_code == 200 and got.content
        t = await session(gw)
        assert not t.of("error") and audio_of(t) > 0
        assert engine_of(gw).client.pool.replicas[0].failures == {}
        assert only.speech_requests == 2  # one request each, no retry


@pytest.mark.parametrize("status", [429, 503])
async def test_a_full_pool_is_busy_with_retry_advice(status: int) -> None:
    with replicas("status", "status", status=status) as pool, front([r.base for r in pool]) as gw:
        got = await speech(gw.http)
        assert got.status_code == 503 and got.json()["error"]["code"] == "busy"
        assert got.headers["retry-after"] == "1"
        t = await session(gw)
        (error,) = t.of("error")
        assert error["code"] == "busy" and error["retry_after_ms"] == 1000
        assert not any(r.ejections for r in engine_of(gw).client.pool.replicas)


async def test_a_dead_or_ejected_replica_is_busy() -> None:
    with replicas("ok") as (only,), ExitStack() as stack:
        proxy = stack.enter_context(_closing(FaultProxy(only.port)))
        gw = stack.enter_context(front([proxy.url], failure_threshold=2))
        assert (await speech(gw.http)).status_code == 200
        proxy.refuse()  # killed: connections refused, then ejected
        for _ in range(4):
            got = await speech(gw.http)
            assert got.status_code == 503 and got.json()["error"]["code"] == "busy"
            assert got.headers["retry-after"] == "1"
        assert engine_of(gw).client.pool.replicas[0].ejections == 1
        t = await session(gw)
        assert [e["code"] for e in t.of("error")] == ["busy"]


async def test_a_replicas_error_text_is_passed_on_without_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    with replicas("status", status=400) as (leaky,), front([leaky.base]) as gw:
        got = await speech(gw.http)
        assert got.status_code == 400 and "full: see" in got.json()["error"]["message"]
        leaky.speech = "sse_leak"
        with front([leaky.base], stream_format="sse") as sse:
            t = await session(sse)
        (error,) = t.of("error")
        assert "boom: see" in error["message"]
    for text in (got.text, json.dumps(error), caplog.text):
        for secret in SECRETS:
            assert secret not in text
    assert LEAK not in caplog.text


def test_a_failure_mid_response_logs_no_traceback(tmp_path: Path) -> None:
    """A real ``gateway serve`` process (its own logging set-up), the
    replica's body cut after about 0.9 s of audio."""
    long_text = "The lighthouse stood on the cliff over the dark water. " * 3
    with (
        replicas("ok") as (good,),
        _closing(FaultProxy(good.port)) as cutting,
        serve_process(
            tmp_path,
            engine="upstream",
            upstream_urls=cutting.url,
            upstream_health_path="",
            upstream_ready_paths="",
            upstream_native_rate=RATE,
            upstream_voices="tone",
        ) as gw,
    ):
        cutting.faults = Faults(cut_after=40_000)
        body = {"input": long_text, "voice": "tone", "response_format": "pcm"}
        with httpx.stream("POST", gw.base + "/v1/audio/speech", json=body, timeout=20) as response:
            assert response.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):  # cut short, never a clean end
                for _ in response.iter_raw():
                    pass
        deadline = time.monotonic() + 5
        while "failed mid-response" not in gw.output() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # anything the server would log after the cut
        output = gw.output()
    assert "HTTP speech failed mid-response" in output
    assert "Traceback" not in output and "Exception in ASGI" not in output, output[-2000:]


async def test_one_failed_probe_changes_readiness_not_the_voices() -> None:
    with (
        replicas("ok", voices=["alto", "tenor"]) as (replica,),
        run_server(
            settings_for(
                engine="upstream",
                upstream={
                    "urls": [replica.base],
                    "probe_interval_s": 0.1,
                    "voices_interval_s": 0.3,
                },
            ),
            None,
        ) as gw,
    ):

        async def names() -> list[str]:
            async with httpx.AsyncClient(timeout=10) as client:
                listing = (await client.get(gw.http + "/v1/audio/voices")).json()
            return sorted(v["name"] for v in listing["data"] if v["type"] == "builtin")

        assert await names() == ["alto", "tenor"]  # the listing, from the start
        replica.models_fail = True  # readiness falls through to the voice listing
        replica.voices = []  # and the listing says nothing: the last good one stays
        await asyncio.sleep(1.0)
        assert await names() == ["alto", "tenor"]
        replica.models_fail = False
        replica.voices = ["alto"]  # a new listing, read on its own schedule
        async with asyncio.timeout(5):
            while await names() != ["alto"]:
                await asyncio.sleep(0.1)


@contextmanager
def _closing(proxy: FaultProxy) -> Iterator[FaultProxy]:
    try:
        yield proxy
    finally:
        proxy.close()


async def test_a_replica_killed_mid_stream_fails_only_its_sentences(tmp_path: Path) -> None:
    """kill -9 of one of two gateway replicas while six sessions stream: a
    session whose sentence was on it gets one partial-audio error and goes
    on; every session ends; the survivor serves a session that starts after."""
    # a first sentence of about 13 s of audio: when every session has its
    # first frames, the replicas are still sending it (the survivor's and the
    # doomed one's alike), so the kill surely cuts the sessions it serves
    long = ", ".join(["the lighthouse over the water keeps its light"] * 5)
    sentences = f"Sentence one is about {long}. Then a short one."
    for name in ("doomed", "survivor"):
        (tmp_path / name).mkdir()
    with (
        serve_process(tmp_path / "doomed", engine="synthetic") as doomed,
        serve_process(tmp_path / "survivor", engine="synthetic") as survivor,
        front([doomed.base, survivor.base], cooldown_s=30.0) as gw,
    ):
        started = asyncio.Event()
        waiting = [6]  #: sessions without their first frames yet

        async def one() -> Transcript:
            async with await open_ws(gw.ws_url) as ws:
                await ws.recv()
                config = {**STREAM, "split_granularity": "sentence"}
                await send(ws, type="session.config", sample_rate=RATE, **config)
                await send(ws, type="input.text", text=sentences)
                await send(ws, type="input.done")
                t = Transcript()
                while len(t.binary) < 5:
                    raw = await asyncio.wait_for(ws.recv(), 30)
                    t.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
                waiting[0] -= 1
                if not waiting[0]:
                    started.set()
                return await recv_until(ws, t, limit_s=90)

        sessions = [asyncio.create_task(one()) for _ in range(6)]
        async with asyncio.timeout(30):
            await started.wait()
        doomed.proc.kill()  # SIGKILL: no goodbye on its connections
        transcripts = await asyncio.gather(*sessions)
        for t in transcripts:
            assert t.of("session.done")  # every session ended
            for error in t.of("error"):
                assert error["code"] in ("internal", "busy"), error
                partial = error["partial_audio"]  # vllm-omni 0.30's "discard"
                assert error["action"] == ("discard" if partial else "sentence_skipped")
            assert len(t.of("audio.done")) == 2  # every sentence ended, failed or not
        # the sessions the doomed replica was sending to were cut (how many
        # depends on the routing), and what follows the kill is served by
        # the survivor
        assert any(t.of("error") for t in transcripts)
        async with await open_ws(gw.ws_url) as ws:
            await ws.recv()
            await send(ws, type="session.config", sample_rate=RATE, **STREAM)
            await send(ws, type="input.text", text=sentences)
            await send(ws, type="input.done")
            after = await recv_until(ws, Transcript(), limit_s=90)
        assert not after.of("error") and len(after.of("audio.done")) >= 2
        got = await speech(gw.http)
        assert got.status_code == 200 and got.content
        assert survivor.proc.poll() is None
