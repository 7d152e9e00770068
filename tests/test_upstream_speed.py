"""The upstream engine and ``speed``: vllm-omni 0.30 refuses a ``speed``
other than 1.0 on a streamed request unless its model has native speed
control, and every segment the upstream engine sends is a stream.  So the
gateway sends ``speed`` only when ``upstream.stream_speed`` declares the
replicas honour it, and otherwise refuses such a speed itself, by name,
before anything is sent (HTTP 400 ``unsupported_option`` with ``param:
"speed"``, the WebSocket's ``error`` with the same code naming it), never a
replica's refusal per sentence."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as settings_for
from tests.faultreplica import RATE, FaultReplica, fault_replica
from tests.helpers import Transcript, open_ws, recv_until, send

PASSIVE = {"health_path": "", "ready_paths": [], "native_rate": RATE, "voices": ["tone"]}


@contextmanager
def front(replica: FaultReplica, **upstream: Any) -> Iterator[RunningServer]:
    config = {"urls": [replica.base], "send_sample_rate": True, **PASSIVE, **upstream}
    with run_server(settings_for(engine="upstream", upstream=config), None) as server:
        yield server


def speak(server: RunningServer, **extra: Any) -> httpx.Response:
    body = {"input": "Hello there.", "voice": "tone", "response_format": "pcm", **extra}
    return httpx.post(server.http + "/v1/audio/speech", json=body, timeout=30)


def test_speed_is_refused_by_name_unless_the_replicas_declare_it() -> None:
    with fault_replica(omni_speed_rule=True) as replica, front(replica) as server:
        refused = speak(server, speed=1.5)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "unsupported_option" and error["param"] == "speed"
        assert replica.speech_requests == 0  # refused before anything was sent
        batch = httpx.post(
            server.http + "/v1/audio/speech/batch",
            json={"voice": "tone", "items": [{"input": "Hi there.", "speed": 2.0}]},
            timeout=30,
        ).json()
        assert batch["results"][0]["code"] == "unsupported_option"
        spoken = speak(server)
        assert spoken.status_code == 200 and len(spoken.content) > 0
        assert replica.bodies and all("speed" not in b for b in replica.bodies)


async def test_the_websocket_refuses_speed_by_name_too() -> None:
    with fault_replica(omni_speed_rule=True) as replica, front(replica) as server:
        async with await open_ws(server.ws_url) as ws:
            await ws.recv()
            await send(ws, type="session.config", response_format="pcm", stream_audio=True)
            await send(ws, type="session.config", speed=1.5)
            await send(ws, type="input.text", text="Hello there.")
            await send(ws, type="input.done")
            transcript = await recv_until(ws, Transcript())
        [error] = [e for e in transcript.events if e["type"] == "error"]
        assert error["code"] == "unsupported_option" and "`speed` 1.5" in error["message"]
        assert error["fatal"] is False  # not the first config: the previous one stays
        assert transcript.binary  # spoken at the pace in force, 1.0
        assert replica.bodies and all("speed" not in b for b in replica.bodies)


@pytest.mark.parametrize("speed", [0.5, 1.5])
def test_declared_stream_speed_is_passed_through(speed: float) -> None:
    with fault_replica() as replica, front(replica, stream_speed=True) as server:
        response = speak(server, speed=speed)
        assert response.status_code == 200, response.text
    [body] = replica.bodies
    assert body["speed"] == speed and body["stream"] is True
