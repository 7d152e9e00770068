"""Voice management over the WebSocket (``voice.list`` / ``voice.add`` /
``voice.remove``) on a real server with its own data directory, and the
same store seen from the HTTP API."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection

from gateway import protocol
from gateway.session.voice_requests import VoiceDesk, VoiceRequest
from tests.conftest import RunningServer
from tests.helpers import open_ws, send
from tests.http.test_http_voices import tone


@pytest.fixture
def server(server_factory: Callable[..., RunningServer], tmp_path: Path) -> RunningServer:
    return server_factory(data_dir=str(tmp_path))


async def _session(server: RunningServer) -> ClientConnection:
    ws = await open_ws(server.ws_url)
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created"
    return ws


async def _ask(ws: ClientConnection, **message: Any) -> dict[str, Any]:
    """Send one request and return the next JSON event (its answer)."""
    await send(ws, **message)
    while True:
        raw = await ws.recv()
        if isinstance(raw, str):
            event: dict[str, Any] = json.loads(raw)
            return event


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def _add(ws: ClientConnection, name: str, audio: bytes | None = None, **extra: Any) -> Any:
    return await _ask(
        ws,
        type="voice.add",
        name=name,
        audio=_b64(tone(2.0) if audio is None else audio),
        consent=True,
        **extra,
    )


def _listed(event: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert event["type"] == "voice.list.result", event
    return {v["name"]: v for v in event["voices"]}


async def test_list_add_remove(server: RunningServer, tmp_path: Path) -> None:
    async with await _session(server) as ws:
        listed = _listed(await _ask(ws, type="voice.list", request_id="l1"))
        assert listed["joe"]["type"] == "builtin"
        assert listed["alloy"]["type"] == "alias" and listed["alloy"]["target"] == "joe"
        assert not [v for v in listed.values() if v["type"] == "uploaded"]

        added = await _add(
            ws, "Ana María", tone(2.5, "FLAC"), ref_text="hello", description="calm", request_id=7
        )
        assert added["type"] == "voice.add.result", added
        assert added["request_id"] == 7
        voice = added["voice"]
        assert voice["name"] == "Ana María" and voice["type"] == "uploaded"
        assert voice["format"] == "flac" and voice["media_type"] == "audio/flac"
        assert voice["ref_text"] == "hello" and voice["description"] == "calm"
        assert voice["consent"] == "true" and voice["speakable"] is False
        assert abs(voice["duration_s"] - 2.5) < 0.01
        files = [p.name for p in (tmp_path / "voices" / "audio").iterdir()]
        assert files == [f"{voice['id']}.flac"]

        listed = _listed(await _ask(ws, type="voice.list"))
        assert listed["Ana María"]["id"] == voice["id"]
        assert listed["joe"]["type"] == "builtin"

        removed = await _ask(ws, type="voice.remove", name="ANA MARÍA", request_id="r1")
        assert removed == {
            "type": "voice.remove.result",
            "request_id": "r1",
            "name": "Ana María",
            "id": voice["id"],
            "deleted": True,
        }
        assert "Ana María" not in _listed(await _ask(ws, type="voice.list"))
        assert list((tmp_path / "voices" / "audio").iterdir()) == []

        # the session still speaks afterwards
        pong = await _ask(ws, type="ping", id=1)
        assert pong == {"type": "pong", "id": 1}


async def test_data_url_and_consent_record(server: RunningServer) -> None:
    async with await _session(server) as ws:
        added = await _ask(
            ws,
            type="voice.add",
            name="dataurl",
            audio="data:application/octet-stream;base64," + _b64(tone(1.5)),
            consent="record-42",
        )
        assert added["type"] == "voice.add.result", added
        assert added["voice"]["format"] == "wav"  # sniffed, the declared type ignored
        assert added["voice"]["consent"] == "record-42"


@pytest.mark.parametrize("name", ["joe", "JOE", "Alloy", "dup", "DUP", "Dup"])
async def test_duplicates_are_refused(server: RunningServer, name: str) -> None:
    async with await _session(server) as ws:
        if name.casefold() == "dup":
            assert (await _add(ws, "dup"))["type"] == "voice.add.result"
        refused = await _add(ws, name, request_id="dup-1")
        assert refused["type"] == "error", refused
        assert refused["code"] == "invalid_state"
        assert refused["fatal"] is False and refused["request_id"] == "dup-1"
        assert "already exists" in refused["message"]


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"audio": _b64(b"this is not audio at all" * 100)}, "not WAV, FLAC, Ogg or MP3"),
        ({"audio": _b64(b"RIFF\x00\x00\x00\x00WAVEgarbage" * 10)}, "could not be decoded"),
        ({"audio": _b64(b"")}, "empty"),
        ({"audio": "not base64!"}, "not valid base64"),
        ({"audio": _b64(tone(0.5))}, "1 to 30 s"),
        ({"audio": _b64(tone(31.0, rate=8000))}, "1 to 30 s"),
        ({"consent": False}, "`consent` is required"),
        ({"consent": "no"}, "`consent` is required"),
        ({"name": "../../x"}, "`name`"),
        ({"name": "nul\x00byte"}, "`name`"),
        ({"name": "x" * 65}, "longer than 64"),
        ({"ref_text": "x" * 2001}, "`ref_text`"),
    ],
    ids=[
        "not-audio",
        "undecodable",
        "empty",
        "bad-base64",
        "too-short",
        "too-long",
        "no-consent",
        "consent-no",
        "dotdot",
        "nul",
        "long-name",
        "long-ref-text",
    ],
)
async def test_invalid_uploads_are_refused_without_closing(
    server: RunningServer, tmp_path: Path, fields: dict[str, Any], needle: str
) -> None:
    message = {
        "type": "voice.add",
        "name": "bad",
        "audio": _b64(tone(2.0)),
        "consent": True,
        "request_id": 5,
        **fields,
    }
    async with await _session(server) as ws:
        # sent before any session.config: invalid_config is still not fatal here
        refused = await _ask(ws, **message)
        assert refused["type"] == "error", refused
        assert refused["code"] == "invalid_config"
        assert refused["fatal"] is False and refused["request_id"] == 5
        assert needle in refused["message"]
        assert (await _ask(ws, type="ping", id="alive"))["type"] == "pong"
    assert list((tmp_path / "voices" / "audio").iterdir()) == []


async def test_remove_unknown_and_builtin(server: RunningServer) -> None:
    async with await _session(server) as ws:
        unknown = await _ask(ws, type="voice.remove", name="nobody", request_id=1)
        assert unknown["type"] == "error" and unknown["code"] == "unknown_voice"
        assert unknown["fatal"] is False and unknown["request_id"] == 1
        assert "nobody" in unknown["message"]
        for builtin in ("joe", "alloy"):
            refused = await _ask(ws, type="voice.remove", name=builtin)
            assert refused["type"] == "error" and refused["code"] == "invalid_state"
            assert refused["fatal"] is False and refused["request_id"] is None
        assert (await _ask(ws, type="ping"))["type"] == "pong"


async def test_malformed_requests(server: RunningServer) -> None:
    async with await _session(server) as ws:
        missing = await _ask(ws, type="voice.add", name="x", consent=True)
        assert missing["code"] == "invalid_message" and "`audio`" in missing["message"]
        wrong = await _ask(ws, type="voice.remove", name=5)
        assert wrong["code"] == "invalid_message" and "`$.name`" in wrong["message"]
        assert missing["fatal"] is False and wrong["fatal"] is False


async def test_websocket_and_http_share_the_store(server: RunningServer) -> None:
    async with (
        await _session(server) as ws,
        httpx.AsyncClient(base_url=server.http, timeout=30) as http,
    ):

        async def http_names() -> dict[str, Any]:
            data = (await http.get("/v1/audio/voices")).json()["data"]
            return {v["name"]: v for v in data}

        async def http_upload(name: str) -> httpx.Response:
            return await http.post(
                "/v1/audio/voices",
                data={"name": name, "consent": "true"},
                files={"audio": ("a.wav", tone(2.0), "audio/wav")},
            )

        assert (await _add(ws, "From WS"))["type"] == "voice.add.result"
        assert (await http_names())["From WS"]["type"] == "uploaded"

        response = await http_upload("From HTTP")
        assert response.status_code == 200, response.text
        listed = _listed(await _ask(ws, type="voice.list"))
        assert listed["From HTTP"]["id"] == response.json()["voice"]["id"]
        # the same payload on both surfaces
        assert listed == await http_names()

        # a name taken over HTTP is refused over the WebSocket, and the other way
        refused = await _add(ws, "from http")
        assert refused["type"] == "error" and refused["code"] == "invalid_state"
        assert (await http_upload("FROM WS")).status_code == 409

        # removed over HTTP: gone for the WebSocket; removed over WS: gone for HTTP
        assert (await http.delete("/v1/audio/voices/From HTTP")).status_code == 200
        assert "From HTTP" not in _listed(await _ask(ws, type="voice.list"))
        removed = await _ask(ws, type="voice.remove", name="From WS")
        assert removed["type"] == "voice.remove.result"
        assert "From WS" not in await http_names()


async def test_over_the_message_cap_closes_with_1009(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(data_dir=str(tmp_path), max_message_bytes=64 * 1024)
    async with await _session(server) as ws:
        await send(
            ws, type="voice.add", name="big", audio=_b64(tone(3.0, rate=16000)), consent=True
        )
        await ws.wait_closed()
        assert ws.close_code == 1009
    async with httpx.AsyncClient(base_url=server.http, timeout=30) as http:
        data = (await http.get("/v1/audio/voices")).json()["data"]
    assert not [v for v in data if v["type"] == "uploaded"]


async def test_session_config_resolves_aliases_and_refuses_uploaded_voices(
    server: RunningServer,
) -> None:
    async with await _session(server) as ws:
        updated = await _ask(ws, type="session.config", voice="Alloy")
        assert updated["type"] == "session.updated" and updated["config"]["voice"] == "joe"
        assert (await _add(ws, "Reference Voice"))["type"] == "voice.add.result"
        error = await _ask(ws, type="session.config", voice="reference voice")
        assert error["code"] == "unsupported_option" and "clone" in error["message"]
        assert error["fatal"] is False  # a config had been accepted
        error = await _ask(ws, type="session.config", speaker="nobody")
        assert error["code"] == "unknown_voice" and "joe" in error["message"]


async def test_a_client_gone_with_voice_requests_waiting_ends_its_session(
    server: RunningServer,
) -> None:
    """Voice requests queued, then a ``session.config`` (which waits for their
    answers), then the client vanishes: the answers cannot be sent, and the
    session still ends at once (its slot and per-address count freed)
    rather than waiting forever for answers that will never go out."""
    for _ in range(3):  # the race is the client's: try it a few times
        ws = await _session(server)
        for i in range(4):
            await send(ws, type="voice.list", request_id=i)
        await send(ws, type="session.config", response_format="pcm")
        ws.transport.abort()
        async with asyncio.timeout(5):
            while server.state.sessions:
                await asyncio.sleep(0.02)


async def test_a_failing_voice_request_is_reported_and_the_next_answered(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug answering one voice request (here: listing raises) is that
    request's ``internal`` error; the session and the requests behind it go on."""
    real = VoiceDesk.answer
    failed: list[int] = []

    async def answer(self: VoiceDesk, message: VoiceRequest) -> Any:
        if isinstance(message, protocol.VoiceList) and not failed:
            failed.append(1)
            raise RuntimeError("a bug")
        return await real(self, message)

    monkeypatch.setattr(VoiceDesk, "answer", answer)
    ws = await _session(server)
    error = await _ask(ws, type="voice.list", request_id="first")
    assert error["type"] == "error" and error["code"] == "internal"
    assert error["request_id"] == "first" and not error["fatal"]
    assert "a bug" not in error["message"]  # no internal detail
    _listed(await _ask(ws, type="voice.list", request_id="second"))
    await ws.close()
