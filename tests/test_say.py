"""``python -m gateway say`` end to end: a subprocess against a running gateway."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import soundfile as sf

from tests.conftest import RunningServer

ROOT = Path(__file__).resolve().parent.parent


def say(url: str, *args: str, **kwargs: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "say", "--url", url, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,  # type: ignore[call-overload]
    )


def test_say_writes_a_wav_file(piper_server: RunningServer, tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    proc = say(piper_server.ws_url, "Hello there.", "-o", str(out))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    audio, rate = sf.read(out, dtype="float32")
    assert rate == 22050 and 0.4 < len(audio) / rate < 3.0


def test_say_pipes_raw_pcm_to_stdout(piper_server: RunningServer) -> None:
    proc = say(piper_server.ws_url, "Hello there.")
    pcm, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert len(pcm) % 2 == 0 and len(pcm) / 2 / 22050 > 0.4
    assert not pcm.startswith(b"RIFF")


def test_say_streams_stdin_as_it_arrives(piper_server: RunningServer) -> None:
    proc = say(piper_server.ws_url, stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"This first sentence is spoken before the input ends. And ")
    proc.stdin.flush()
    # audio arrives while standard input is still open: chunks are sent as read
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    assert ready, "no audio before the end of input"
    first = os.read(proc.stdout.fileno(), 4096)
    assert first
    time.sleep(0.1)
    rest, err = proc.communicate("then the rest, with caf\u00e9.".encode(), timeout=60)
    assert proc.returncode == 0, err
    assert (len(first) + len(rest)) / 2 / 22050 > 2.0


def test_say_refuses_to_write_audio_to_a_terminal(piper_server: RunningServer) -> None:
    import pty

    leader, follower = pty.openpty()
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", "say", "--url", piper_server.ws_url, "Hi."],
            cwd=ROOT,
            env=env,
            stdout=follower,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(leader)
        os.close(follower)
    assert proc.returncode == 2 and b"-o" in proc.stderr
