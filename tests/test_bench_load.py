"""The load scenarios' pure parts (gateway.bench.load, gateway.bench.runner);
their runs against a server are the harness's (docs/benchmarks.md)."""

from __future__ import annotations

import os

from gateway.bench.load import rss_mib, vllm_omni_payload
from gateway.bench.runner import DEFAULT_SCENARIOS, SCENARIOS, ServerUnderTest, parse_args


def test_the_payload_is_vllm_omnis_benchmark_payload() -> None:
    assert vllm_omni_payload("Hello.") == {
        "input": "Hello.",
        "language": "English",
        "stream": True,
        "response_format": "pcm",
        "task_type": "CustomVoice",
        "voice": "joe",
    }


def test_the_http_base_follows_the_websocket_url() -> None:
    plain = ServerUnderTest("ws://127.0.0.1:8000/v1/audio/speech/stream", None)
    assert plain.http_base == "http://127.0.0.1:8000"
    tls = ServerUnderTest("wss://tts.example.com/v1/audio/speech/stream", 7)
    assert tls.http_base == "https://tts.example.com" and tls.pid == 7


def test_defaults_of_the_load_scenarios() -> None:
    args = parse_args([])
    assert args.levels.split(",")[-1] == "20"  # the capacity ladder reaches the target
    assert args.http_levels == "1,4,10,16" and args.http_requests == 24
    assert args.overload_sessions == 40 and args.overload_addresses >= 2
    assert set(DEFAULT_SCENARIOS) < set(SCENARIOS)
    assert {"http-load", "overload"} == set(SCENARIOS) - set(DEFAULT_SCENARIOS)


def test_rss_of_this_process() -> None:
    rss = rss_mib(os.getpid())
    assert rss is not None and rss > 10
    assert rss_mib(None) is None
