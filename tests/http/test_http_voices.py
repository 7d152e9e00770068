"""/v1/audio/voices: upload, list, delete, validation, persistence, reconciliation."""

from __future__ import annotations

import io
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from gateway.voices.store import MAX_UPLOAD_BYTES
from tests.conftest import RunningServer
from tests.helpers import serve_process

ROOT = Path(__file__).resolve().parents[2]


def tone(seconds: float, fmt: str = "WAV", rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format=fmt)
    return buf.getvalue()


def upload(
    server: RunningServer,
    name: str,
    audio: bytes | None = None,
    *,
    consent: str | None = "true",
    mime: str = "audio/wav",
    field: str = "audio",
    extra: dict[str, str] | None = None,
) -> httpx.Response:
    data = {"name": name, **(extra or {})}
    if consent is not None:
        data["consent"] = consent
    files = {field: ("ref.bin", tone(3.0) if audio is None else audio, mime)}
    return httpx.post(server.http + "/v1/audio/voices", data=data, files=files, timeout=60)


def names(server: RunningServer) -> dict[str, dict[str, object]]:
    doc = httpx.get(server.http + "/v1/audio/voices", timeout=30).json()
    return {v["name"]: v for v in doc["data"]}


@pytest.fixture
def server(server_factory: Callable[..., RunningServer], tmp_path: Path) -> RunningServer:
    return server_factory(data_dir=str(tmp_path))


def test_upload_list_speak_delete(server: RunningServer, tmp_path: Path) -> None:
    response = upload(
        server,
        "Ana María",
        tone(2.5, "FLAC"),
        mime="application/octet-stream",
        extra={"ref_text": "hello", "speaker_description": "calm"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["success"] is True  # vllm-omni 0.30's answer
    voice = response.json()["voice"]
    assert voice["format"] == "flac" and voice["media_type"] == "audio/flac"
    assert voice["description"] == "calm" and abs(voice["duration_s"] - 2.5) < 0.01
    listed = names(server)
    assert listed["Ana María"]["type"] == "uploaded"
    assert listed["joe"]["type"] == "builtin"
    assert listed["alloy"]["type"] == "alias" and listed["alloy"]["target"] == "joe"
    # stored under a generated name, never the user's
    files = [p.name for p in (tmp_path / "voices" / "audio").iterdir()]
    assert files == [f"{voice['id']}.flac"]
    # Piper cannot clone: a clear unsupported_option
    spoken = httpx.post(
        server.http + "/v1/audio/speech",
        json={"model": "tts-1", "voice": "ana maría", "input": "Hello."},
        timeout=30,
    )
    assert spoken.status_code == 400
    assert spoken.json()["error"]["code"] == "unsupported_option"
    deleted = httpx.delete(server.http + "/v1/audio/voices/ANA MARÍA", timeout=30)
    assert deleted.status_code == 200 and deleted.json()["deleted"]
    assert deleted.json()["success"] is True
    assert deleted.json()["message"] == "Voice 'Ana María' deleted successfully"
    assert "Ana María" not in names(server)
    assert list((tmp_path / "voices" / "audio").iterdir()) == []
    again = httpx.delete(server.http + "/v1/audio/voices/Ana María", timeout=30)
    assert again.status_code == 404  # vllm-omni 0.30's status for a missing voice
    assert again.json()["error"]["code"] == "not_found"
    builtin = httpx.delete(server.http + "/v1/audio/voices/joe", timeout=30)
    assert builtin.status_code == 409


def test_vllm_field_names(server: RunningServer) -> None:
    response = upload(server, "sample", field="audio_sample", mime="audio/x-wav")
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("name", ["joe", "JOE", "Alloy", "shimmer", "dup", "DUP", "Dup"])
def test_duplicates_are_refused(server: RunningServer, name: str) -> None:
    if name.casefold() == "dup":
        assert upload(server, "dup").status_code == 200
    response = upload(server, name)
    assert response.status_code == 409, response.text
    assert response.json()["error"]["param"] == "name"


def test_nfc_names_are_one_name(server: RunningServer) -> None:
    assert upload(server, "Zoe\u0301").status_code == 200  # decomposed é
    response = upload(server, "zo\u00e9")  # composed é, other case
    assert response.status_code == 409


@pytest.mark.parametrize(
    ("audio", "mime", "code", "status"),
    [
        (b"this is not audio at all" * 100, "audio/wav", "invalid_config", 400),  # lying MIME
        (b"RIFF\x00\x00\x00\x00WAVEgarbage" * 10, "audio/wav", "invalid_config", 400),
        (b"\x00\x00\x00\x18ftypM4A " + b"\x00" * 2000, "audio/mp4", "invalid_config", 400),
        (b"", "audio/wav", "invalid_config", 400),
    ],
    ids=["text-as-wav", "undecodable-wav", "m4a-refused", "empty"],
)
def test_bad_content(
    server: RunningServer, audio: bytes, mime: str, code: str, status: int
) -> None:
    response = upload(server, "bad", audio, mime=mime)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert "bad" not in names(server)


def test_wav_declared_as_image_is_accepted_as_wav(server: RunningServer) -> None:
    response = upload(server, "png", tone(2.0), mime="image/png")
    assert response.status_code == 200 and response.json()["voice"]["format"] == "wav"


@pytest.mark.parametrize(
    ("seconds", "ok"), [(0.5, False), (1.2, True), (29.0, True), (31.0, False)]
)
def test_duration_limits(server: RunningServer, seconds: float, ok: bool) -> None:
    response = upload(server, "len", tone(seconds, rate=8000))
    assert (response.status_code == 200) is ok, response.text
    if not ok:
        assert "1 to 30 s" in response.json()["error"]["message"]


def test_too_big(server: RunningServer) -> None:
    response = upload(server, "big", b"RIFF" + b"\x00" * (MAX_UPLOAD_BYTES + 100))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "message_too_large"


@pytest.mark.parametrize(
    "name",
    ["../../x", "/etc/passwd", "a/b", "nul\x00byte", "x" * 65, "", " padded", ".hidden", "a\\b"],
    ids=["dotdot", "absolute", "slash", "nul", "long", "empty", "space", "dot", "backslash"],
)
def test_hostile_names(server: RunningServer, tmp_path: Path, name: str) -> None:
    response = upload(server, name)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "name"
    assert list((tmp_path / "voices" / "audio").iterdir()) == []


def test_consent_is_required(server: RunningServer) -> None:
    for consent in (None, "", "false"):
        response = upload(server, "noconsent", consent=consent)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "consent"


def test_concurrent_uploads_of_one_name(server: RunningServer, tmp_path: Path) -> None:
    results: list[int] = []

    def go(i: int) -> None:
        results.append(upload(server, "Race" if i % 2 else "race").status_code)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [200, 409, 409, 409, 409, 409]
    assert len(list((tmp_path / "voices" / "audio").iterdir())) == 1


def test_voices_survive_a_new_process_and_orphans_are_reconciled(tmp_path: Path) -> None:
    with serve_process(tmp_path, engine="synthetic") as server:
        base = server.base
        response = httpx.post(
            base + "/v1/audio/voices",
            data={"name": "Keeper", "consent": "true"},
            files={"audio": ("a.wav", tone(2.0), "audio/wav")},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        doomed = httpx.post(
            base + "/v1/audio/voices",
            data={"name": "Doomed", "consent": "true"},
            files={"audio": ("a.wav", tone(2.0), "audio/wav")},
            timeout=30,
        ).json()["voice"]
    audio_dir = tmp_path / "voices" / "audio"
    # a crash mid-upload (file renamed, row never committed) and a lost file
    (audio_dir / "0123456789abcdef0123456789abcdef.wav").write_bytes(tone(2.0))
    (audio_dir / "deadbeef.wav.tmp").write_bytes(b"partial")
    (audio_dir / f"{doomed['id']}.wav").unlink()
    with serve_process(tmp_path, engine="synthetic") as server:
        listed = httpx.get(server.base + "/v1/audio/voices", timeout=30).json()["uploaded_voices"]
        assert [v["name"] for v in listed] == ["Keeper"]
    kept = response.json()["voice"]
    assert sorted(p.name for p in audio_dir.iterdir()) == [f"{kept['id']}.wav"]
    db = sqlite3.connect(tmp_path / "voices" / "voices.sqlite3")
    try:
        assert [r[0] for r in db.execute("SELECT name FROM voices")] == ["Keeper"]
    finally:
        db.close()
