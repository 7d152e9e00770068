"""The load scenarios (gateway.bench.load, gateway.bench.runner): their pure
parts, and what the overload scenario reports of a real server's refusals
(full runs are the harness's: docs/benchmarks.md)."""

from __future__ import annotations

import io
import os
from collections.abc import Callable

import httpx
import pytest

from gateway.bench import load
from gateway.bench.drivers import GatewayUser, Pacing
from gateway.bench.load import rss_mib, vllm_omni_payload
from gateway.bench.measure import playout
from gateway.bench.runner import (
    DEFAULT_SCENARIOS,
    SCENARIOS,
    Progress,
    ServerUnderTest,
    parse_args,
    run_users,
)
from tests.conftest import RunningServer


def test_the_payload_is_vllm_omnis_benchmark_payload() -> None:
    assert vllm_omni_payload("Hello.") == {
        "input": "Hello.",
        "stream": True,
        "stream_format": "audio",
        "response_format": "pcm",
        "voice": "joe",
    }


def test_the_payload_gets_a_raw_pcm_stream(piper_server: RunningServer) -> None:
    """What the http-load scenario measures is raw PCM, not SSE (``stream:
    true`` alone is SSE, as in vllm-omni 0.30)."""
    response = httpx.post(
        piper_server.http + "/v1/audio/speech", json=vllm_omni_payload("Hello there."), timeout=60
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/pcm"
    assert "content-length" not in response.headers  # streamed
    assert len(response.content) % 2 == 0 and len(response.content) > 24_000


def test_the_http_base_follows_the_websocket_url() -> None:
    plain = ServerUnderTest("ws://127.0.0.1:8000/v1/audio/speech/stream", None)
    assert plain.http_base == "http://127.0.0.1:8000"
    tls = ServerUnderTest("wss://tts.example.com/v1/audio/speech/stream", 7)
    assert tls.http_base == "https://tts.example.com" and tls.pid == 7


def test_defaults_of_the_load_scenarios() -> None:
    args = parse_args([])
    assert args.levels.split(",")[-1] == "20"  # the capacity ladder reaches the target
    assert args.capacity_turns == "conversation"  # issue 27's ladder takes turns
    assert args.http_levels == "1,4,10,16" and args.http_requests == 24
    assert args.overload_sessions == 40 and args.overload_addresses >= 2
    assert set(DEFAULT_SCENARIOS) < set(SCENARIOS)
    assert {"http-load", "overload", "hostile"} == set(SCENARIOS) - set(DEFAULT_SCENARIOS)
    assert args.hostile_phase_s == 24 and args.hostile_every_s == 3 and args.hostile_rounds == 2


@pytest.mark.parametrize("turn_taking", [True, False])
async def test_a_capacity_user_takes_turns_with_its_listener(
    piper_server: RunningServer, turn_taking: bool
) -> None:
    """The capacity ladder's conversations (issue 27: "with turn-taking"): a
    user's next reply starts once its listener has heard the last one to
    its end, not as soon as the last one's audio has all arrived (the
    server sends it faster than it plays)."""
    records = await run_users(
        lambda: GatewayUser(piper_server.ws_url),
        target="gateway",
        scenario="capacity",
        level=1,
        texts=[["The first reply is a sentence of a few words.", "And a second one."]],
        pacing=Pacing(streamed=False),
        seed=1,
        cancel_range_s=None,
        progress=Progress(2, "test", io.StringIO()),
        turn_taking=turn_taking,
    )
    first, second = records
    assert first.error is None and second.error is None
    heard = playout(first.pieces()).end
    assert heard is not None and first.arrivals[-1] < heard - 0.5  # sent ahead of playback
    next_text = second.sends[0][0]
    assert (next_text >= heard) is turn_taking


def test_rss_of_this_process() -> None:
    rss = rss_mib(os.getpid())
    assert rss is not None and rss > 10
    assert rss_mib(None) is None


async def test_overload_reports_how_long_each_refusal_waited_in_the_queue(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Three replies at once for one slot: one is spoken, the other two wait
    out the admission deadline and are refused with retry advice, and the
    scenario reports the server's own count of each one's wait (protocol
    1.4's ``waited_ms``), which the deadline bounds."""
    server = server_factory(max_active_streams=1, admission_deadline_s=0.3)
    lines = await load.overload(
        server.ws_url,
        sessions=3,
        arrival_s=0.0,
        addresses=1,
        pacing=Pacing(streamed=False),
        seed=3,
        prebuffer_ms=0.0,
        server_pid=None,
        settle_s=0.0,
    )
    summary = lines[-1]
    assert summary["kind"] == "overload"
    assert (summary["admitted"], summary["busy"], summary["busy_with_retry_advice"]) == (1, 2, 2)
    assert summary["busy_refused_at_once"] == 0 and summary["other_errors"] == []
    assert summary["busy_after_audio"] == 0
    refused = [line for line in lines if line["kind"] == "overload_session" and line["busy"]]
    assert all(300 <= line["queue_waited_ms"] < 3000 for line in refused)
    assert summary["busy_queue_waited_ms"]["n"] == 2


def test_the_hostile_verdict_checks_the_issue_targets() -> None:
    """``hostile``'s verdict (issue 28): hostile p95 within x1.5 + 150 ms of
    benign, no gap over 100 ms, RSS within idle + 300 MB, no item over the
    bound."""
    from gateway.bench.hostile import neighbour_inputs, verdict

    def phase(p95: float, gap: float, idle: float, peak: float, item: float | None) -> dict:
        return {
            "canary_first_audio_ms": {"p95": p95},
            "canary_max_gap_ms": gap,
            "rss_idle_mib": idle,
            "rss_peak_mib": peak,
            "largest_work_item": item,
            "canary_errors": 0,
        }

    ok = verdict(phase(200, 50, 600, 700, 150), phase(450, 90, 600, 890, 199), 200)
    assert ok["first_audio_ok"] and ok["gap_ok"] and ok["rss_ok"] and ok["work_item_ok"]
    bad = verdict(phase(200, 50, 600, 700, 150), phase(451, 101, 600, 901, 201), 200)
    assert not (bad["first_audio_ok"] or bad["gap_ok"] or bad["rss_ok"] or bad["work_item_ok"])
    unknown = verdict(phase(200, 50, 600, 700, None), phase(300, 50, 600, 700, None), None)
    assert unknown["work_item_ok"] is None  # a server that exports no bound
    # the benign twin reads as long as the hostile text expands to
    benign, hostile = neighbour_inputs("benign"), neighbour_inputs("hostile")
    assert benign.keys() == hostile.keys() == {"alias", "numbers", "http"}
    assert set(hostile["alias"][1]) == {"qq"} and not benign["alias"][1]
    assert abs(len(benign["http"][0]) - 19916) < 100
