"""The upstream gateway starts as it is deployed: the README's upstream
command, run as written (only the replicas' URLs, the port and the data
folder are this test's), with its two gateway replicas started *after* it,
as Kubernetes or compose may start them.  The front must come up, stay
unready while no replica answers, turn ready once one does (on the default
probe paths, which a gateway replica answers), and speak."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
from voice_gateway_wire.testing import free_port

from tests.conftest import run_server
from tests.conftest import test_settings as settings_for
from tests.faultreplica import RATE, fault_replica
from tests.helpers import ROOT, serve_process


def readme_command() -> str:
    lines = (ROOT / "README.md").read_text().splitlines()
    (command,) = [line for line in lines if line.startswith("GATEWAY_ENGINE=upstream ")]
    return command


def wait_for(url: str, status: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        try:
            if httpx.get(url, timeout=1).status_code == status:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def test_the_readme_command_starts_before_its_replicas(tmp_path: Path) -> None:
    command = readme_command()
    written = re.search(r"GATEWAY_UPSTREAM_URLS=(\S+)", command)
    assert written is not None and written.group(1).count(",") == 1  # two replicas
    ports = [free_port(), free_port()]
    urls = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    command = command.replace(written.group(0), f"GATEWAY_UPSTREAM_URLS={urls}")
    front = free_port()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GATEWAY_PORT": str(front),
        "GATEWAY_DATA_DIR": str(tmp_path / "front"),
    }
    log = tmp_path / "front.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{front}"
    try:
        wait_for(base + "/healthz", 200, proc, log)  # up, with no replica at all
        assert httpx.get(base + "/readyz", timeout=5).status_code == 503
        with (
            serve_process(tmp_path / "a", port=ports[0], engine="synthetic"),
            serve_process(tmp_path / "b", port=ports[1], engine="synthetic"),
        ):
            wait_for(base + "/readyz", 200, proc, log)
            voices = httpx.get(base + "/v1/audio/voices", timeout=5).json()["data"]
            voice = next(v for v in voices if v["type"] == "builtin")
            body = {"input": "Hello there.", "voice": voice["name"], "response_format": "pcm"}
            spoken = httpx.post(base + "/v1/audio/speech", json=body, timeout=30)
            assert spoken.status_code == 200, spoken.text
            assert len(spoken.content) > voice["sample_rate"] // 4  # some audio, spoken
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = log.read_text(errors="replace")
    assert "Traceback" not in output, output[-3000:]


async def test_the_rate_comes_from_the_first_replica_that_turns_ready() -> None:
    """No ``native_rate`` and a listing without rates (vllm-omni's): the
    front starts with its one replica down, unready, and reads the rate from
    the replica's WAV header once a probe finds it ready."""
    port = free_port()
    upstream = {"urls": [f"http://127.0.0.1:{port}"], "probe_interval_s": 0.1}
    with run_server(settings_for(engine="upstream", upstream=upstream), None) as gw:
        async with httpx.AsyncClient(timeout=5) as client:
            assert (await client.get(gw.http + "/readyz")).status_code == 503
            with fault_replica(port=port, listed_rates=False, voices=["alto"]) as replica:
                deadline = time.monotonic() + 10
                while (await client.get(gw.http + "/readyz")).status_code != 200:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                listing = (await client.get(gw.http + "/v1/audio/voices")).json()["data"]
                (voice,) = [v for v in listing if v["type"] == "builtin"]
                assert voice["name"] == "alto" and voice["sample_rate"] == RATE, listing
                body = {"input": "Hello.", "voice": "alto", "response_format": "pcm"}
                spoken = await client.post(gw.http + "/v1/audio/speech", json=body)
                assert spoken.status_code == 200 and len(spoken.content) > RATE // 4
                assert replica.speech_requests == 2  # the rate probe, then the speech
