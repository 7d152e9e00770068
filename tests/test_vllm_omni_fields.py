"""vllm-omni 0.30's speech requests, field by field, against real servers.

vllm-omni is not installed here: its field lists are transcribed below from
the 0.30.0 wheel (``pip download --no-deps vllm-omni==0.30.0``), file
``vllm_omni/entrypoints/openai/protocol/audio.py``, with the line each
field is declared on.  Every request sends values off 0.30's defaults.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from gateway import protocol
from gateway.engines.base import Engine
from tests.conftest import RunningServer, run_server
from tests.conftest import test_settings as make_settings
from tests.helpers import (
    FAIL_MARKER,
    FailOnMarkerEngine,
    Transcript,
    open_ws,
    recv_until,
    send,
)
from tests.http.helpers import decode

#: ``StreamingSpeechSessionConfig`` (audio.py lines 556-621): the fields of a
#: WebSocket ``session.config``, each with the line it is declared on
STREAMING_CONFIG_FIELDS_030 = {
    "model": 559,
    "voice": 560,  # validation_alias AliasChoices("voice", "speaker")
    "task_type": 561,
    "language": 562,
    "instructions": 563,
    "response_format": 564,
    "speed": 565,
    "max_new_tokens": 566,
    "initial_codec_chunk_frames": 567,
    "non_streaming_mode": 573,
    "ref_audio": 581,
    "ref_text": 582,
    "x_vector_only_mode": 583,
    "speaker_embedding": 584,
    "stream_audio": 589,
    "word_timestamps": 597,
    "seed": 606,
    "split_granularity": 612,
}
#: ``OpenAICreateSpeechRequest`` (audio.py lines 58-195): the HTTP body
SPEECH_REQUEST_FIELDS_030 = {
    "input": 59,
    "model": 60,
    "voice": 64,  # validation_alias AliasChoices("voice", "speaker")
    "instructions": 79,
    "response_format": 83,
    "sample_rate": 84,
    "speed": 88,
    "stream_format": 93,
    "stream": 101,
    "task_type": 112,
    "language": 116,
    "ref_audio": 120,
    "ref_text": 124,
    "ref_audio_2": 128,
    "ambient_sound": 133,
    "duration_seconds": 138,
    "x_vector_only_mode": 143,
    "speaker_embedding": 147,
    "max_new_tokens": 154,
    "seed": 160,
    "initial_codec_chunk_frames": 167,
    "non_streaming_mode": 173,
    "extra_params": 181,
    "word_timestamps": 185,
}
#: keys 0.30 reads before validation: ``speaker`` (the alias, lines 64-68)
#: and ``references`` (``normalize_references_alias``, lines 228-274)
ALIASES_030 = ("speaker", "references")
#: 0.30's WebSocket size limits (``serving_speech_stream.py`` lines 79-80)
MAX_CONFIG_MESSAGE_030 = 4 * 1024 * 1024
MAX_INPUT_TEXT_MESSAGE_030 = 128 * 1024

TEXT = "Hello there. The quick brown fox jumps over the lazy dog."


def _bare(words: list[str]) -> list[str]:
    return [w.strip(".,!?") for w in words]


def test_every_030_field_is_a_known_field() -> None:
    """No field of 0.30's models is "unknown" here (warned and dropped)."""
    from gateway.http.plan import BODY_FIELDS  # here: the rest of the module runs on main

    ws_fields = set(protocol.SessionConfig.__struct_fields__)
    assert set(STREAMING_CONFIG_FIELDS_030) | {"speaker"} <= ws_fields
    assert set(SPEECH_REQUEST_FIELDS_030) | set(ALIASES_030) <= BODY_FIELDS


def test_030_limits_fit_the_default_limits() -> None:
    settings = make_settings()
    assert settings.max_message_bytes >= MAX_CONFIG_MESSAGE_030
    # 0.30 counts characters of the whole message; the gateway UTF-8 bytes of the text
    assert settings.max_input_text_bytes >= 4 * MAX_INPUT_TEXT_MESSAGE_030
    assert settings.max_utterance_chars >= MAX_INPUT_TEXT_MESSAGE_030


# --------------------------------------------------------------------------
# WebSocket
# --------------------------------------------------------------------------


async def _session(server: RunningServer) -> Any:
    ws = await open_ws(server.ws_url)
    assert json.loads(await ws.recv())["type"] == "session.created"
    return ws


#: every 0.30 config field Piper can take, off 0.30's defaults
CONFIG_030 = {
    "model": "tts-1",
    "speaker": "joe",
    "task_type": "CustomVoice",
    "language": "English",
    "instructions": "",
    "response_format": "pcm",
    "speed": 1.0,  # 0.30 requires 1.0 with stream_audio
    "max_new_tokens": 512,
    "initial_codec_chunk_frames": 2,
    "non_streaming_mode": True,
    "x_vector_only_mode": False,
    "stream_audio": True,
    "word_timestamps": True,
    "seed": 1234,
    "split_granularity": "clause",
}


async def test_030_config_with_word_timestamps_and_an_unknown_field(
    piper_server: RunningServer,
) -> None:
    """0.30's config off its defaults, plus a field nobody knows: a
    ``warning`` names it, the config applies, and the audio comes as 0.30's
    JSON ``audio.chunk`` frames whose closing chunk carries the words."""
    async with await _session(piper_server) as ws:
        await send(ws, type="session.config", **CONFIG_030, emotion="cheerful")
        warning = json.loads(await ws.recv())
        assert warning["type"] == "warning" and warning["code"] == "unknown_fields"
        assert warning["fields"] == ["emotion"] and "`emotion`" in warning["message"]
        updated = json.loads(await ws.recv())
        assert updated["type"] == "session.updated"
        config = updated["config"]
        assert config["word_timestamps"] is True and config["seed"] == 1234
        assert config["split_granularity"] == "clause"
        await send(ws, type="input.text", text=TEXT)
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
    assert not t.binary and not t.of("error")  # audio rides the JSON chunks
    starts = t.of("audio.start")
    assert len(starts) >= 2  # split on the sentence (and clause) boundaries
    spoken: list[str] = []
    for start in starts:
        index = start["sentence_index"]
        chunks = [c for c in t.of("audio.chunk") if c["sentence_index"] == index]
        assert [c["chunk_id"] for c in chunks] == list(range(len(chunks)))
        *audio, closing = chunks
        assert audio and all(c["timestamps"] is None for c in audio)
        pcm = b"".join(base64.b64decode(c["audio_b64"]) for c in audio)
        rate = start["sample_rate"]
        assert all(c["sample_rate"] == rate for c in chunks)
        assert audio[0]["chunk_start_ms"] == 0
        for before, after in itertools.pairwise(audio):
            assert after["chunk_start_ms"] == before["chunk_end_ms"]
        samples = np.frombuffer(pcm, "<i2")
        assert np.sqrt(np.mean((samples / 32768.0) ** 2)) > 0.01  # speech
        assert closing["audio_b64"] == "" and closing["chunk_start_ms"] == 0
        assert abs(closing["chunk_end_ms"] - len(samples) * 1000 / rate) <= 1
        words = closing["timestamps"]
        assert words, start["sentence_text"]
        for word in words:
            assert set(word) == {"word", "start_ms", "end_ms"}
            assert 0 <= word["start_ms"] <= word["end_ms"] <= closing["chunk_end_ms"] + 1
        spoken += [w["word"] for w in words]
    assert _bare(spoken) == _bare(TEXT.split())


@pytest.mark.parametrize(("granularity", "sentences"), [("none", 1), ("sentence", 2), (None, 2)])
async def test_030_split_granularity(
    piper_server: RunningServer, granularity: str | None, sentences: int
) -> None:
    """0.30's ``none`` (its default: one request per ``input.done``) and
    ``sentence`` mean the same here; left out, the gateway's ``auto`` cuts
    the utterance (docs/protocol.md says why)."""
    config = {"voice": "joe", "response_format": "wav"}
    if granularity is not None:
        config["split_granularity"] = granularity
    async with await _session(piper_server) as ws:
        await send(ws, type="session.config", **config)
        assert json.loads(await ws.recv())["type"] == "session.updated"
        for piece in ("Hello there. The quick brown ", "fox jumps over the lazy dog."):
            await send(ws, type="input.text", text=piece)
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
    assert t.of("session.done")[0]["total_sentences"] == sentences
    assert len(t.binary) == sentences  # one whole WAV per sentence, as in 0.30


async def test_unknown_fields_alone_are_never_fatal(piper_server: RunningServer) -> None:
    async with await _session(piper_server) as ws:
        await send(ws, type="session.config", voice="Default", vioce="ana", top_p=0.9)
        warning = json.loads(await ws.recv())
        assert warning["fields"] == ["vioce", "top_p"] and warning["type"] == "warning"
        updated = json.loads(await ws.recv())
        assert updated["type"] == "session.updated" and updated["config"]["voice"] == "joe"
        await send(ws, type="input.text", text="Still here.")
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
        assert t.of("audio.done") and not t.of("error")


@pytest.mark.parametrize(
    ("config", "code", "param"),
    [
        ({"speaker_embedding": [0.25] * 1024}, "unsupported_option", "speaker_embedding"),
        ({"task_type": "Base", "ref_audio": "https://x/y.wav"}, "unsupported_option", "task_type"),
        ({"word_timestamps": True, "response_format": "wav"}, "invalid_config", "word_timestamps"),
        ({"speaker_embedding": [0.5, "x"]}, "invalid_config", "speaker_embedding"),
    ],
)
async def test_030_fields_the_engine_cannot_honour_are_named(
    piper_server: RunningServer, config: dict[str, Any], code: str, param: str
) -> None:
    async with await _session(piper_server) as ws:
        await send(ws, type="session.config", voice="joe")
        assert json.loads(await ws.recv())["type"] == "session.updated"
        await send(ws, type="session.config", **config)
        error = json.loads(await ws.recv())
        assert error["type"] == "error" and error["code"] == code, error
        assert f"`{param}`" in error["message"] and error["fatal"] is False


async def test_030_size_limits(piper_server: RunningServer) -> None:
    """A 3.5 MiB ``session.config`` (reference audio inside) is read and
    answered, not closed with 1009; a 100 KiB ``input.text`` is accepted."""
    async with await _session(piper_server) as ws:
        await send(ws, type="session.config", voice="joe", **{"stream_audio": True})
        assert json.loads(await ws.recv())["type"] == "session.updated"
        audio = "data:audio/wav;base64," + "A" * (3 * 1024 * 1024 + 512 * 1024)
        await send(ws, type="session.config", ref_audio=audio)
        error = json.loads(await ws.recv())
        assert error["code"] == "unsupported_option" and "`ref_audio`" in error["message"]
        words = "Words to read. " * (100 * 1024 // 15)
        assert len(words) > 64 * 1024
        await send(ws, type="input.text", text=words)
        await send(ws, type="cancel")
        t = await recv_until(ws, Transcript(), stop="session.done")
        assert not [e for e in t.of("error") if e["code"] == "text_too_long"]
        assert t.of("session.done")[0]["cancelled"] is True


@pytest.mark.parametrize(("after_chunks", "action"), [(2, "discard"), (0, "sentence_skipped")])
async def test_failed_sentence_action(
    server_factory: Callable[..., RunningServer],
    piper_engine: Engine,
    after_chunks: int,
    action: str,
) -> None:
    """0.30 marks a sentence that failed after some of its audio went out
    ``action: "discard"``; one that failed before any is skipped."""
    server = server_factory(engine=FailOnMarkerEngine(piper_engine, after_chunks=after_chunks))
    async with await _session(server) as ws:
        await send(
            ws, type="session.config", response_format="pcm", stream_audio=True,
            split_granularity="sentence",
        )  # fmt: skip
        assert json.loads(await ws.recv())["type"] == "session.updated"
        await send(ws, type="input.text", text=f"This one {FAIL_MARKER} breaks. The last is fine.")
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
    error = t.of("error")[0]
    assert error["action"] == action and error["partial_audio"] is (after_chunks > 0)
    assert [d["error"] for d in t.of("audio.done")] == [True, False]


# --------------------------------------------------------------------------
# seed: Piper draws its noise from a seeded generator
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampling_server() -> Iterator[RunningServer]:
    """Piper with its noise on (the shared test engine is deterministic)."""
    import asyncio

    from gateway.engines.registry import create_engine

    settings = make_settings(engine="piper", piper={"deterministic": False})
    engine = create_engine(settings)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    try:
        with run_server(settings, engine) as server:
            yield server
    finally:
        loop.run_until_complete(engine.aclose())
        loop.close()


async def _ws_audio(server: RunningServer, seed: int | None) -> bytes:
    async with await _session(server) as ws:
        config = {"voice": "joe", "response_format": "pcm", "stream_audio": True}
        await send(ws, type="session.config", **config, **({} if seed is None else {"seed": seed}))
        assert json.loads(await ws.recv())["type"] == "session.updated"
        await send(ws, type="input.text", text=TEXT)
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
    return b"".join(t.binary)


async def test_seed_makes_the_websocket_audio_reproducible(
    sampling_server: RunningServer,
) -> None:
    first, again = await _ws_audio(sampling_server, -7), await _ws_audio(sampling_server, -7)
    assert first == again
    other = await _ws_audio(sampling_server, 8)
    unseeded = [await _ws_audio(sampling_server, None) for _ in range(2)]
    assert other != first and unseeded[0] != unseeded[1]


def test_seed_makes_the_http_audio_reproducible(sampling_server: RunningServer) -> None:
    def speak(seed: int) -> bytes:
        body = {"input": TEXT, "voice": "joe", "response_format": "pcm", "seed": seed}
        response = httpx.post(sampling_server.http + "/v1/audio/speech", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.content

    assert speak(2**62) == speak(2**62) != speak(3)


# --------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------


def _post(server: RunningServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.http + "/v1/audio/speech", json=body, timeout=60)


@pytest.mark.parametrize(
    "voice",
    [
        {},  # voice is optional in 0.30
        {"voice": "default"},
        {"speaker": "joe"},
        {"voice": {"id": "joe", "name": "ignored"}},
        {"speaker": {"id": "alloy"}},
        {"voice": "joe", "speaker": "JOE"},
    ],
    ids=["none", "default", "speaker", "object", "speaker-object", "both"],
)
def test_030_voice_forms(piper_server: RunningServer, voice: dict[str, Any]) -> None:
    response = _post(piper_server, {"input": "Hi there.", "response_format": "wav", **voice})
    assert response.status_code == 200, response.text
    audio, _ = decode(response.content, "wav")
    assert len(audio) > 0


def test_030_body_off_its_defaults_with_an_unknown_field(piper_server: RunningServer) -> None:
    """Every 0.30 field Piper can take, off its defaults, and a field nobody
    knows: 200, the field named in ``X-Ignored-Fields``, the words in 0.30's
    ``X-Word-Timestamps``."""
    body = {
        "input": TEXT,
        "model": "tts-1",
        "speaker": "joe",
        "instructions": "",
        "response_format": "wav",
        "sample_rate": 16000,
        "speed": 1.25,
        "stream": False,
        "task_type": "CustomVoice",
        "language": "en",
        "ref_audio": "",
        "ref_text": "",
        "ref_audio_2": "",
        "ambient_sound": "",
        "x_vector_only_mode": False,
        "speaker_embedding": [],
        "max_new_tokens": 100,
        "seed": 99,
        "initial_codec_chunk_frames": 3,
        "non_streaming_mode": True,
        "extra_params": {},
        "word_timestamps": True,
        "temperature": 0.7,
    }
    response = _post(piper_server, body)
    assert response.status_code == 200, response.text
    assert response.headers["x-ignored-fields"] == '"temperature"'
    audio, rate = decode(response.content, "wav")
    assert rate == 16000
    words = json.loads(response.headers["x-word-timestamps"])
    assert _bare([w["word"] for w in words]) == _bare(TEXT.split())
    assert all(set(w) == {"word", "start_ms", "end_ms"} for w in words)
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts) and words[-1]["end_ms"] <= len(audio) * 1000 / rate + 1


#: one sentence over Piper's ``max_item_phonemes`` (200): spoken as several work items
LONG_SENTENCE = (
    "The old lighthouse stood at the edge of the cliff for a hundred years and every night"
    " its lamp turned slowly over the dark water while sailors far away counted the flashes"
    " and knew where the rocks were and the keeper climbed the stairs with oil and a lantern."
)


def test_030_word_timestamps_of_a_sentence_spoken_in_pieces(piper_server: RunningServer) -> None:
    """A sentence cut into work items times its later pieces' words from the
    sentence's start (``WordTimings``' contract), once: every word in order,
    inside the audio."""
    body = {"input": LONG_SENTENCE, "voice": "joe", "response_format": "pcm", "stream": False}
    response = _post(piper_server, {**body, "word_timestamps": True})
    assert response.status_code == 200, response.text
    words = json.loads(response.headers["x-word-timestamps"])
    assert _bare([w["word"] for w in words]) == _bare(LONG_SENTENCE.split())
    audio_ms = len(response.content) // 2 * 1000 / 24000
    for before, after in itertools.pairwise(words):
        assert before["start_ms"] <= before["end_ms"] <= after["start_ms"] + 1, (before, after)
    assert words[-1]["end_ms"] <= audio_ms + 1


def test_030_long_word_timestamps_are_omitted_with_a_marker(piper_server: RunningServer) -> None:
    text = " ".join(["Words and more words to read aloud."] * 40)
    body = {"input": text, "voice": "joe", "response_format": "pcm", "stream": False}
    response = _post(piper_server, {**body, "word_timestamps": True})
    assert response.status_code == 200, response.text
    assert "x-word-timestamps" not in response.headers
    assert response.headers["x-word-timestamps-omitted"].startswith("oversize; bytes=")


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"ref_audio": ["https://a/1.wav", "https://a/2.wav"]}, "unsupported_option", "ref_audio"),
        ({"references": [{"audio_path": "https://a/1.wav", "text": "Hi."}]}, "unsupported_option",
         "ref_audio"),
        ({"references": [{"audio_path": "a"}, {"audio_path": "b"}]}, "invalid_config",
         "references"),
        ({"references": [{"audio_path": "a"}], "ref_audio": "b"}, "invalid_config", "references"),
        ({"ref_audio_2": "https://a/2.wav"}, "unsupported_option", "ref_audio_2"),
        ({"speaker_embedding": [[0.5, 0.25]]}, "unsupported_option", "speaker_embedding"),
        ({"ambient_sound": "waves on rocks"}, "unsupported_option", "ambient_sound"),
        ({"duration_seconds": 3.0}, "unsupported_option", "duration_seconds"),
        ({"duration_seconds": -1}, "invalid_config", "duration_seconds"),
        ({"extra_params": {"top_k": 50}}, "unsupported_option", "extra_params"),
        ({"word_timestamps": True, "stream": True}, "invalid_config", "word_timestamps"),
        ({"voice": "joe", "speaker": "alloy"}, "invalid_config", "voice"),
    ],
)  # fmt: skip
def test_030_fields_that_would_change_the_audio_are_named(
    piper_server: RunningServer, fields: dict[str, Any], code: str, param: str
) -> None:
    response = _post(piper_server, {"input": "Hi there.", "response_format": "wav", **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
