"""What an untrusted client can and cannot do to a real server: loopback
only, bounded loops.  By concern: pathological and oversized upload forms,
the Host, Origin and X-Forwarded-For guards, malformed messages and text,
error messages without internals, confusable voice names, per-client HTTP
limits, and how server-side failures are reported (1011, 1007, freed slots,
encoding off the event loop); the pure parsers last.  The stall rule is in
tests/flow/test_stall.py.

``server_log`` (tests/conftest.py) collects what the in-process servers log:
a client's mistake must never leave a traceback there.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
from websockets.exceptions import ConnectionClosed

import gateway.http.speech as speech_route
from gateway.audio.containers import ContainerEncoder
from gateway.engines.base import Engine, VoiceInfo
from gateway.http.security import HostPolicy, startup_warnings
from gateway.settings import load_settings
from tests.conftest import LogCollector, RunningServer, no_traceback
from tests.helpers import FailOnMarkerEngine, open_ws, send
from tests.rawws import Closed, RawClient

LONG_TEXT = " ".join(["The quick brown fox jumps over the lazy dog."] * 12)


# --- helpers ----------------------------------------------------------------------


#: the shared log collector (tests/conftest.py), by this module's old names
_Collect = LogCollector
_no_traceback = no_traceback


def tone(seconds: float = 2.0, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


def _upload(
    server: RunningServer, name: str, audio: bytes, headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(
        server.http + "/v1/audio/voices",
        data={"name": name, "consent": "true"},
        files={"audio": ("ref.wav", audio, "audio/wav")},
        headers=headers,
        timeout=60,
    )


async def _session(url: str, **kwargs: Any) -> Any:
    ws = await open_ws(url, **kwargs)
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created", created
    return ws


async def _ping_rtt(ws: Any, ping_id: int) -> float:
    started = time.perf_counter()
    await send(ws, type="ping", id=ping_id)
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == "pong" and event["id"] == ping_id:
            return time.perf_counter() - started


async def _refusal(url: str, **kwargs: Any) -> tuple[dict[str, Any], int]:
    async with await open_ws(url, **kwargs) as ws:
        error = json.loads(await ws.recv())
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None
        return error, closed.value.rcvd.code


@pytest.fixture
def server(server_factory: Callable[..., RunningServer], tmp_path: Path) -> RunningServer:
    return server_factory(data_dir=str(tmp_path))


# --- 1: pathological multipart uploads -----------------------------------------------


def _many_parts_body(parts: int) -> tuple[bytes, str]:
    part = b'--XyZ\r\nContent-Disposition: form-data; name="a"\r\n\r\nx\r\n'
    return part * parts + b"--XyZ--\r\n", "multipart/form-data; boundary=XyZ"


def _newline_part_body(size: int) -> tuple[bytes, str]:
    head = (
        b'--XyZ\r\nContent-Disposition: form-data; name="name"\r\n\r\nnl\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="consent"\r\n\r\ntrue\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="audio"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\n"
    )
    return head + b"\n" * size + b"\r\n--XyZ--\r\n", "multipart/form-data; boundary=XyZ"


async def test_pathological_multipart_keeps_other_sessions_responsive(
    server: RunningServer, server_log: _Collect
) -> None:
    """#1: 140,000 tiny parts (8 MB) and a 10 MiB part of newlines are parsed
    off the event loop: another session's ping round trip stays under 100 ms,
    and each upload gets a documented 4xx code."""
    ws = await _session(server.ws_url)
    rtts: list[float] = []
    done = asyncio.Event()

    async def pinger() -> None:
        n = 0
        while not done.is_set():
            n += 1
            rtts.append(await _ping_rtt(ws, n))
            await asyncio.sleep(0.01)

    task = asyncio.create_task(pinger())
    results = []
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            for body, content_type in (
                _many_parts_body(140_000),
                _newline_part_body(10 * 1024 * 1024 - 4096),
            ):
                response = await client.post(
                    server.http + "/v1/audio/voices",
                    content=body,
                    headers={"content-type": content_type},
                )
                results.append((response.status_code, response.json()["error"]["code"]))
    finally:
        done.set()
        await task
        await ws.close()
    assert results == [(413, "message_too_large"), (400, "invalid_config")], results
    assert len(rtts) > 5
    print(f"ping rtt during the uploads: max {max(rtts) * 1000:.1f} ms over {len(rtts)}")
    assert max(rtts) < 0.1
    _no_traceback(server_log)


def test_form_limits(server: RunningServer) -> None:
    """#1: a text field over its size and an oversized part header are refused."""
    big_field = httpx.post(
        server.http + "/v1/audio/voices",
        data={"name": "x", "consent": "true", "ref_text": "a" * 20_000},
        files={"audio": ("ref.wav", tone(), "audio/wav")},
        timeout=60,
    )
    assert big_field.status_code == 413, big_field.text
    assert big_field.json()["error"]["param"] == "ref_text"
    not_form = httpx.post(server.http + "/v1/audio/voices", content=b"{}", timeout=30)
    assert not_form.status_code == 400
    assert not_form.json()["error"]["code"] == "invalid_message"


# --- 4: X-Forwarded-For -------------------------------------------------------------


async def test_forwarded_for_from_loopback_does_not_escape_limits(
    server_factory: Callable[..., RunningServer],
) -> None:
    """#4: no proxy is trusted by default, so a spoofed X-Forwarded-For is not
    a new client address for the WebSocket or the HTTP limits."""
    server = server_factory(max_sessions_per_client=2, max_http_requests_per_minute=3)
    first = await _session(server.ws_url, additional_headers={"X-Forwarded-For": "10.0.0.1"})
    second = await _session(server.ws_url, additional_headers={"X-Forwarded-For": "10.0.0.2"})
    try:
        error, code = await _refusal(
            server.ws_url, additional_headers={"X-Forwarded-For": "10.0.0.3"}
        )
        assert error["code"] == "busy" and code == 1013
    finally:
        await first.close()
        await second.close()
    async with httpx.AsyncClient(base_url=server.http) as http:
        statuses = [
            (
                await http.get("/v1/audio/voices", headers={"X-Forwarded-For": f"10.0.1.{i}"})
            ).status_code
            for i in range(4)
        ]
    assert statuses == [200, 200, 200, 429]


# --- 5: DNS rebinding ---------------------------------------------------------------


async def test_foreign_host_is_refused_on_websocket_and_http(
    server_factory: Callable[..., RunningServer], server_log: _Collect
) -> None:
    """#5: a rebinding page sends its own name as Host and a matching Origin."""
    server = server_factory(allowed_hosts=["tts.example", ".corp.example"])
    port = int(server.http.rsplit(":", 1)[1])
    evil = f"evil.example:{port}"
    error, code = await _refusal(
        f"ws://{evil}/v1/audio/speech/stream",
        host="127.0.0.1",
        port=port,
        origin=f"http://{evil}",
    )
    assert error["code"] == "host_not_allowed" and error["fatal"] is True and code == 1008
    async with httpx.AsyncClient(base_url=server.http, timeout=30) as http:
        for method, path, body in (
            ("GET", "/v1/audio/voices", None),
            ("POST", "/v1/audio/speech", {"input": "Hi.", "voice": "joe"}),
        ):
            response = await http.request(
                method, path, json=body, headers={"Host": evil, "Origin": f"http://{evil}"}
            )
            assert response.status_code == 403, response.text
            assert response.json()["error"]["code"] == "host_not_allowed"
        # the server's own names, with or without a port
        for host in (
            f"localhost:{port}",
            "localhost",
            f"127.0.0.1:{port}",
            f"[::1]:{port}",
            "TTS.example",
            f"a.corp.example:{port}",
        ):
            response = await http.get("/v1/audio/voices", headers={"Host": host})
            assert response.status_code == 200, (host, response.text)
        # probes by IP address still work
        assert (await http.get("/healthz", headers={"Host": evil})).status_code == 200
    ws = await _session(
        f"ws://tts.example:{port}/v1/audio/speech/stream", host="127.0.0.1", port=port
    )
    await ws.close()
    _no_traceback(server_log)


def test_host_policy_and_startup_warnings() -> None:
    """#5: bound to all interfaces with no allowed_hosts (the Docker image),
    any Host is served, with a warning; a listed name turns the check on."""
    docker = load_settings(None, overrides={"host": "0.0.0.0"}, environ={})
    assert HostPolicy.from_settings(docker).allows("anything.example:8000")
    assert any("DNS rebinding" in w for w in startup_warnings(docker))
    named = load_settings(
        None, overrides={"host": "0.0.0.0", "allowed_hosts": ["tts.example"]}, environ={}
    )
    policy = HostPolicy.from_settings(named)
    assert policy.allows("tts.example:8000") and policy.allows("localhost:8000")
    assert not policy.allows("evil.example:8000") and not policy.allows(None)
    assert not any("DNS rebinding" in w for w in startup_warnings(named))
    keyed = load_settings(None, overrides={"host": "::", "api_keys": ["k"]}, environ={})
    assert startup_warnings(keyed) == []
    local = load_settings(None, overrides={}, environ={})
    assert startup_warnings(local) == []
    assert not HostPolicy.from_settings(local).allows("evil.example")


# --- 6: Origin on the HTTP API -------------------------------------------------------


def test_cross_site_writes_are_refused(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """#6: a foreign page's multipart upload and text/plain speech POST are
    refused; same-origin and listed Origins are served; reads are not checked."""
    server = server_factory(data_dir=str(tmp_path), allowed_origins=["https://app.example"])
    foreign = {"Origin": "https://evil.example"}
    upload = _upload(server, "Mallory", tone(), headers=foreign)
    assert upload.status_code == 403, upload.text
    assert upload.json()["error"]["code"] == "origin_not_allowed"
    simple_post = httpx.post(
        server.http + "/v1/audio/speech",
        content=json.dumps({"input": "Hello.", "voice": "joe"}),
        headers={**foreign, "Content-Type": "text/plain"},
        timeout=30,
    )
    assert simple_post.status_code == 403
    assert simple_post.json()["error"]["code"] == "origin_not_allowed"
    deleted = httpx.delete(server.http + "/v1/audio/voices/x", headers={"Origin": "null"})
    assert deleted.status_code == 403
    listed = httpx.get(server.http + "/v1/audio/voices", headers=foreign)
    assert listed.status_code == 200 and "Mallory" not in listed.text
    same_origin = {"Origin": server.http}
    assert _upload(server, "Alice", tone(), headers=same_origin).status_code == 200
    allowed = {"Origin": "https://app.example"}
    assert _upload(server, "Bob", tone(), headers=allowed).status_code == 200


# --- 7: deeply nested JSON -----------------------------------------------------------


async def test_deeply_nested_json_is_a_non_fatal_error(
    server: RunningServer, server_log: _Collect
) -> None:
    """#7: a 2 KB message nested 1,000 deep is `invalid_message`, not a dropped
    connection; HTTP answers 400 with the same code."""
    nested = "[" * 1000 + "]" * 1000
    ws = await _session(server.ws_url)
    try:
        await ws.send('{"type": "ping", "id": ' + nested + "}")
        error = json.loads(await ws.recv())
        assert error["type"] == "error" and error["code"] == "invalid_message"
        assert error["fatal"] is False
        await ws.send(nested)
        assert json.loads(await ws.recv())["code"] == "invalid_message"
        assert await _ping_rtt(ws, 7) < 5
    finally:
        await ws.close()
    async with httpx.AsyncClient(base_url=server.http, timeout=30) as http:
        for path in ("/v1/audio/speech", "/v1/audio/speech/batch"):
            response = await http.post(
                path,
                content='{"input": ' + nested + "}",
                headers={"Content-Type": "application/json"},
            )
            assert response.status_code == 400, response.text
            assert response.json()["error"]["code"] == "invalid_message"
    _no_traceback(server_log)


# --- 8: batch items with a non-string input ------------------------------------------


@pytest.mark.parametrize("value", [5, None])
def test_batch_input_of_the_wrong_type_is_400(
    server: RunningServer, server_log: _Collect, value: object
) -> None:
    """#8: the same 400 and code as the single endpoint."""
    single = httpx.post(
        server.http + "/v1/audio/speech", json={"input": value, "voice": "joe"}, timeout=30
    )
    assert single.status_code == 400
    batch = httpx.post(
        server.http + "/v1/audio/speech/batch",
        json={"voice": "joe", "items": [{"input": "Fine."}, {"input": value}]},
        timeout=30,
    )
    assert batch.status_code == 400, batch.text
    assert batch.json()["error"]["code"] == single.json()["error"]["code"] == "invalid_message"
    assert "items[1].input" in batch.json()["error"]["message"]
    _no_traceback(server_log)


# --- 9: NUL in text ------------------------------------------------------------------


async def test_nul_in_text_is_a_client_error(server: RunningServer, server_log: _Collect) -> None:
    """#9: `invalid_message` on both surfaces (HTTP 400, param input; on the
    WebSocket not fatal), worded alike, and the text is not spoken in part."""
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(
            server.http + "/v1/audio/speech",
            json={"input": "Hello\x00 world.", "voice": "joe", "response_format": "wav"},
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_message" and error["param"] == "input"
    assert "contains a NUL character (U+0000); remove it" in error["message"]
    ws = await _session(server.ws_url)
    try:
        await send(ws, type="input.text", text="Hello\x00 there.")
        event = json.loads(await ws.recv())
        assert event["type"] == "error" and event["code"] == "invalid_message"
        assert event["fatal"] is False
        await send(ws, type="input.done")
        while (event := json.loads(await ws.recv()))["type"] != "session.done":
            assert event["type"] != "audio.start", event
        assert event["total_sentences"] == 0
    finally:
        await ws.close()
    _no_traceback(server_log)


# --- 10: no internals in error messages ----------------------------------------------


def test_undecodable_upload_error_has_no_internals(server: RunningServer) -> None:
    """#10: libsndfile's message names a BytesIO at a memory address."""
    wav = tone()
    damaged = wav[:20] + b"\xff\xff" + wav[22:]  # an unknown WAVE format tag
    response = _upload(server, "Broken", damaged)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "0x" not in message and "object at" not in message and "BytesIO" not in message
    assert "upload a complete WAV" in message


# --- 11: confusable voice names ------------------------------------------------------


async def test_confusable_voice_names_are_refused(server: RunningServer) -> None:
    """#11: TR39 skeletons: Cyrillic `јое` beside the built-in `joe`, a mixed
    `Аnna` beside an uploaded `Anna` (HTTP and WebSocket); a different name
    is fine."""
    async with httpx.AsyncClient(base_url=server.http, timeout=60) as http:

        async def upload(name: str) -> httpx.Response:
            return await http.post(
                "/v1/audio/voices",
                data={"name": name, "consent": "true"},
                files={"audio": ("ref.wav", tone(), "audio/wav")},
            )

        lookalike = await upload("јое")  # Cyrillic je, o, ie
        assert lookalike.status_code == 409, lookalike.text
        assert lookalike.json()["error"]["code"] == "invalid_state"
        assert "looks like" in lookalike.json()["error"]["message"]
        assert (await upload("Anna")).status_code == 200
        assert (await upload("\u0410nna")).status_code == 409
        assert (await upload("Anne")).status_code == 200
    ws = await _session(server.ws_url)
    try:
        audio = base64.b64encode(tone()).decode()
        await send(ws, type="voice.add", name="\u0410nne", audio=audio, consent=True, request_id=1)
        error = json.loads(await ws.recv())
        assert error["code"] == "invalid_state" and error["request_id"] == 1
        assert error["fatal"] is False
    finally:
        await ws.close()


# --- 13: per-client limits on HTTP ---------------------------------------------------


def test_http_request_rate_per_client(server_factory: Callable[..., RunningServer]) -> None:
    """#13: requests per minute per client address: 429 `rate_limited`."""
    server = server_factory(max_http_requests_per_minute=5)
    statuses = [httpx.get(server.http + "/v1/audio/voices").status_code for _ in range(6)]
    assert statuses == [200] * 5 + [429]
    refused = httpx.get(server.http + "/v1/audio/voices")
    assert refused.json()["error"]["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    assert httpx.get(server.http + "/healthz").status_code == 200  # not an API route


def test_http_concurrency_per_client(server_factory: Callable[..., RunningServer]) -> None:
    """#13: requests in progress per client address, a streamed body counting
    until it ends."""
    server = server_factory(max_http_requests_per_client=1)
    body = {"input": LONG_TEXT, "voice": "joe", "response_format": "pcm"}
    with httpx.stream("POST", server.http + "/v1/audio/speech", json=body, timeout=120) as first:
        assert first.status_code == 200
        chunks = first.iter_bytes()
        next(chunks)  # streaming now
        second = httpx.get(server.http + "/v1/audio/voices")
        assert second.status_code == 429, second.text
        assert second.json()["error"]["code"] == "rate_limited"
        for _ in chunks:
            pass
    assert httpx.get(server.http + "/v1/audio/voices").status_code == 200


# --- 12: server failures, invalid UTF-8, stall close, encoder ------------------------


class _ExplodingLookupEngine(FailOnMarkerEngine):
    """A voice lookup that fails as a server bug would (not a client error)."""

    def find_voice(self, name: str) -> VoiceInfo | None:
        if "XBOOMX" in name:
            raise RuntimeError("injected server bug (test marker)")
        return super().find_voice(name)


async def test_unexpected_failure_closes_1011(
    server_factory: Callable[..., RunningServer], piper_engine: Engine
) -> None:
    """#12: an unexpected exception ends the session with `internal` and 1011,
    not a dropped connection."""
    server = server_factory(engine=_ExplodingLookupEngine(piper_engine))
    ws = await _session(server.ws_url)
    await send(ws, type="session.config", voice="XBOOMX")
    error = json.loads(await ws.recv())
    assert error["code"] == "internal" and error["fatal"] is True
    assert "XBOOMX" not in error["message"] and "RuntimeError" not in error["message"]
    with pytest.raises(ConnectionClosed) as closed:
        await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
    async with asyncio.timeout(10):
        while server.state.sessions:
            await asyncio.sleep(0.05)


async def test_invalid_utf8_frame_closes_1007_without_traceback(
    server: RunningServer, server_log: _Collect
) -> None:
    """#12: invalid UTF-8 in a text frame is the client's mistake."""
    client = RawClient(server.ws_url, rcvbuf=65536)
    await client.connect()
    assert isinstance(await client.recv(), dict)
    client.proto.send_text(b"\xff\xfe not utf-8")
    await client._flush()
    async with asyncio.timeout(10):
        while not isinstance(message := await client.recv(), Closed):
            pass
    client.close()
    assert message.code == 1007
    async with asyncio.timeout(10):
        while server.state.sessions:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    _no_traceback(server_log)


def test_encoder_failure_releases_the_http_slot(
    server_factory: Callable[..., RunningServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """#12: creating the encoder throws: the slot comes back."""
    server = server_factory(max_http_streams=1)

    def broken(*args: object, **kwargs: object) -> ContainerEncoder:
        raise RuntimeError("injected encoder failure (test marker)")

    body = {"input": "Hello.", "voice": "joe", "response_format": "wav"}
    with monkeypatch.context() as patch:
        patch.setattr(speech_route, "ContainerEncoder", broken)
        failed = httpx.post(server.http + "/v1/audio/speech", json=body, timeout=30)
    assert failed.status_code == 500
    assert failed.json()["error"]["code"] == "internal"
    assert server.state.http_admission.active == 0
    assert httpx.post(server.http + "/v1/audio/speech", json=body, timeout=60).status_code == 200


def test_container_encoding_runs_off_the_event_loop(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#12: MP3 encoding (``ContainerEncoder.push``) runs in worker threads."""
    threads: list[threading.Thread] = []
    real_push = ContainerEncoder.push

    def spy(self: ContainerEncoder, samples: Any) -> bytes:
        threads.append(threading.current_thread())
        return real_push(self, samples)

    monkeypatch.setattr(ContainerEncoder, "push", spy)
    response = httpx.post(
        server.http + "/v1/audio/speech",
        json={"input": "Hello there.", "voice": "joe", "response_format": "mp3"},
        timeout=60,
    )
    assert response.status_code == 200 and response.content
    assert threads
    assert all(t is not server.thread for t in threads)


# --- pure cores ----------------------------------------------------------------------


def _form(*parts: bytes) -> bytes:
    return b"".join(b"--XyZ\r\n" + p + b"\r\n" for p in parts) + b"--XyZ--\r\n"


def test_parse_form_limits() -> None:
    """#1: the limits hold inside the parser, whatever the body."""
    from gateway.errors import GatewayError
    from gateway.voices.forms import parse_form

    ct = "multipart/form-data; boundary=XyZ"
    limits = {"max_parts": 4, "max_field_bytes": 10, "max_file_bytes": 100}
    fields = parse_form(
        ct,
        _form(
            b'Content-Disposition: form-data; name="name"\r\n\r\nAnna',
            b'Content-Disposition: form-data; name="audio"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\n" + b"\n" * 50,
        ),
        **limits,
    )
    assert bytes(fields["name"].data) == b"Anna" and fields["name"].filename is None
    assert fields["audio"].filename == "a.wav" and fields["audio"].content_type == "audio/wav"
    assert len(fields["audio"].data) == 50
    many_headers = b"".join(b"X-H%d: v\r\n" % i for i in range(9))
    cases = [
        (_form(*[b'Content-Disposition: form-data; name="a"\r\n\r\nx'] * 5), "message_too_large"),
        (
            _form(b'Content-Disposition: form-data; name="a"\r\n\r\n' + b"x" * 11),
            "message_too_large",
        ),
        (
            _form(b'Content-Disposition: form-data; name="a"\r\n' + many_headers + b"\r\nx"),
            "invalid_message",
        ),
        (b"--XyZ\r\nno headers end" + b"\x00" * 10, "invalid_message"),
    ]
    for body, code in cases:
        with pytest.raises(GatewayError) as raised:
            parse_form(ct, body, **limits)
        assert str(raised.value.code) == code, body[:60]
    with pytest.raises(GatewayError) as raised:
        parse_form("application/json", b"{}", **limits)
    assert str(raised.value.code) == "invalid_message"


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8000", "localhost"),
        ("LOCALHOST.", "localhost"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("127.0.0.1:80", "127.0.0.1"),
        ("tts.example", "tts.example"),
    ],
)
def test_host_name(header: str, name: str) -> None:
    from gateway.http.security import host_name

    assert host_name(header) == name
