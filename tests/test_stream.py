"""The WebSocket protocol end to end: a real uvicorn server on a loopback
port, real WebSocket clients, the real Piper engine."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gateway.audio.encoding import decode
from gateway.audio.framing import unpack_frame
from gateway.engines.base import Engine
from tests.conftest import RunningServer
from tests.helpers import FAIL_MARKER, FailOnMarkerEngine, Transcript, open_ws, recv_until, send

SENTENCES = "The quick brown fox jumped over the lazy dog. It was a sunny day in the park."
LOW_LATENCY = {"response_format": "pcm", "stream_audio": True, "frame_ms": 20}


async def _session(server: RunningServer) -> tuple[ClientConnection, dict[str, Any]]:
    ws = await open_ws(server.ws_url)
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created"
    return ws, created


# --------------------------------------------------------------------------
# a client written only from vllm-omni's documentation
# --------------------------------------------------------------------------


async def _vllm_omni_client(url: str, config: dict[str, object], text: str) -> list[bytes]:
    """Per the vllm-omni docs: config, input.text word by word, input.done;
    one file per sentence between audio.start and audio.done.  Ignores
    message types it does not know."""
    files: list[bytes] = []
    async with await open_ws(url) as ws:
        await ws.send(json.dumps({"type": "session.config", **config}))
        for word in text.split(" "):
            await ws.send(json.dumps({"type": "input.text", "text": word + " "}))
        await ws.send(json.dumps({"type": "input.done"}))
        current: bytearray | None = None
        rate = 0
        fmt = ""
        while True:
            message = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(message, bytes):
                assert current is not None
                current.extend(message)
                continue
            event = json.loads(message)
            if event["type"] == "audio.start":
                current, rate, fmt = bytearray(), event["sample_rate"], event["format"]
            elif event["type"] == "audio.done":
                assert current is not None and not event["error"]
                assert event["total_bytes"] == len(current)
                if fmt == "pcm":
                    buf = io.BytesIO()
                    pcm = np.frombuffer(bytes(current), "<i2")
                    sf.write(buf, pcm, rate, format="WAV", subtype="PCM_16")
                    files.append(buf.getvalue())
                else:
                    files.append(bytes(current))
                current = None
            elif event["type"] == "session.done":
                assert event["total_sentences"] == len(files)
                return files
            elif event["type"] == "error":
                raise AssertionError(event["message"])


VLLM_DEFAULTS = {"task_type": "CustomVoice", "language": "Auto", "speed": 1.0, "voice": "joe"}


@pytest.mark.parametrize(
    "extra",
    [{"response_format": "wav"}, {"response_format": "pcm", "stream_audio": True}],
    ids=["wav", "pcm-stream"],
)
async def test_vllm_omni_documented_client(
    piper_server: RunningServer, extra: dict[str, object]
) -> None:
    files = await _vllm_omni_client(piper_server.ws_url, {**VLLM_DEFAULTS, **extra}, SENTENCES)
    assert len(files) == 2
    for data in files:
        audio, rate = sf.read(io.BytesIO(data), dtype="float32")
        assert rate == 22050
        assert 0.8 < len(audio) / rate < 6.0
        assert np.sqrt(np.mean(audio**2)) > 0.01  # speech, not silence


async def test_vllm_omni_example_client_with_its_default_voice(
    piper_server: RunningServer,
) -> None:
    """vllm-omni's examples/online_serving/qwen3_tts/streaming_speech_client.py
    run unchanged: its messages, byte for byte as its defaults build them
    (``voice: "Vivian"``, a Qwen3-TTS preset), over a plain
    ``websockets.connect``.  The unknown voice is a non-fatal error naming the
    available voices; the config is refused whole, and the text is spoken in
    the default voice as WAV (the gateway's default format, as the client's)."""
    config = {
        "voice": "Vivian",
        "task_type": "CustomVoice",
        "language": "Auto",
        "response_format": "wav",
        "speed": 1.0,
    }
    errors: list[dict[str, Any]] = []
    files: list[bytes] = []
    chunks: list[bytes] = []
    async with websockets.connect(piper_server.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.config", **config}))
        await ws.send(json.dumps({"type": "input.text", "text": SENTENCES}))
        await ws.send(json.dumps({"type": "input.done"}))
        while True:
            message = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(message, bytes):
                chunks.append(message)
                continue
            msg = json.loads(message)
            if msg["type"] == "audio.start":
                chunks = []
            elif msg["type"] == "audio.done":
                files.append(b"".join(chunks))
                assert msg.get("error", False) is False
            elif msg["type"] == "session.done":
                assert msg["total_sentences"] == len(files)
                break
            elif msg["type"] == "error":
                errors.append(msg)
    assert [(e["code"], e["fatal"]) for e in errors] == [("unknown_voice", False)]
    assert "'Vivian'" in errors[0]["message"] and "joe" in errors[0]["message"]
    assert len(files) == 2
    for data in files:
        audio, rate = sf.read(io.BytesIO(data), dtype="float32")
        assert rate == 22050
        assert np.sqrt(np.mean(audio**2)) > 0.01  # speech, not silence


async def test_unknown_voice_in_first_config_keeps_the_defaults(
    piper_server: RunningServer,
) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", voice="Vivian", sample_rate=16000)
        error = json.loads(await ws.recv())
        assert error["code"] == "unknown_voice" and error["fatal"] is False
        # refused whole: the sample rate did not change either
        await send(ws, type="input.text", text="Still the defaults.")
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
        start = t.of("audio.start")[0]
        assert start["sample_rate"] == 22050  # joe's native rate, not 16000
        assert t.of("error") == []
        await send(ws, type="session.config", voice="joe")
        assert json.loads(await ws.recv())["type"] == "session.updated"


# --------------------------------------------------------------------------
# sessions, utterances, contexts
# --------------------------------------------------------------------------


async def test_session_created_and_updated(piper_server: RunningServer) -> None:
    ws, created = await _session(piper_server)
    async with ws:
        assert created["protocol_version"].startswith("2.")
        voices = created["voices"]
        assert any(v["name"] == "joe" and v["language"] == "en-US" for v in voices)
        caps = created["capabilities"]  # the engine's own declaration
        assert caps["alignment"] is True and caps["cloning"] is False
        assert caps["sample_rates"] == [22050] and caps["input"] == "segments"
        await send(ws, type="session.config", voice="JOE", sample_rate=16000, **LOW_LATENCY)
        updated = json.loads(await ws.recv())
        assert updated["type"] == "session.updated"
        cfg = updated["config"]
        assert cfg["voice"] == "joe" and cfg["sample_rate"] == 16000
        assert cfg["frame_samples"] == 320


async def test_several_utterances_one_connection(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", **LOW_LATENCY)
        t = Transcript()
        for text in ("Hello there.", "How are you today?", "Goodbye."):
            await send(ws, type="input.text", text=text)
            await send(ws, type="input.done")
        await recv_until(ws, t, count=3)
        done = t.of("session.done")
        assert [d["utterance_index"] for d in done] == [0, 1, 2]
        for d in done:
            m = d["metrics"]
            assert m["audio_ms"] > 200 and m["compute_rtf"] > 0
            assert m["first_audio_ms"] is not None
        _check_pairing(t)


def _check_pairing(t: Transcript) -> None:
    """Every audio.start is closed by exactly one audio.done, in order, and
    binary frames only appear between them (raw framing)."""
    open_sentence: tuple[int, int] | None = None
    for item in t.items:
        if isinstance(item, bytes):
            assert open_sentence is not None
            continue
        if item["type"] == "audio.start":
            assert open_sentence is None
            open_sentence = (item["utterance_index"], item["sentence_index"])
        elif item["type"] == "audio.done":
            assert open_sentence == (item["utterance_index"], item["sentence_index"])
            open_sentence = None
    assert open_sentence is None


async def test_nothing_lost_or_duplicated(piper_server: RunningServer) -> None:
    text = (
        "Dr. Smith paid $1,000.50 on Jan. 3, e.g. for rent... Then he left! "
        "Visit https://example.com/a.b?c=1 today; it is 3.14 times better. Okay?"
    )
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", **LOW_LATENCY)
        for i in range(0, len(text), 3):
            await send(ws, type="input.text", text=text[i : i + 3])
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
        spoken = " ".join(e["sentence_text"] for e in t.of("audio.start"))
        assert spoken.split() == text.split()


async def test_first_segment_leaves_before_input_done(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", **LOW_LATENCY)
        await send(ws, type="input.text", text="Hello world, this is a test. And ")
        t = await recv_until(ws, Transcript(), stop="audio.start")
        assert t.of("audio.start")[0]["sentence_text"] == "Hello world,"
        await send(ws, type="input.text", text="more.")
        await send(ws, type="input.done")
        await recv_until(ws, t)


async def test_flush_keeps_utterance_open(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", split_granularity="none", **LOW_LATENCY)
        await send(ws, type="input.text", text="First part")
        await send(ws, type="input.flush")
        t = await recv_until(ws, Transcript(), stop="audio.done")
        assert t.of("audio.start")[0]["sentence_text"] == "First part"
        assert not t.of("session.done")
        await send(ws, type="input.text", text="second part")
        await send(ws, type="input.done")
        await recv_until(ws, t)
        done = t.of("session.done")
        assert len(done) == 1 and done[0]["total_sentences"] == 2
        assert {e["utterance_index"] for e in t.of("audio.start")} == {0}


async def test_two_contexts_raw_framing_do_not_interleave(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", **LOW_LATENCY)
        await send(ws, type="input.text", text="Context A speaks first.", context_id="a")
        await send(ws, type="input.text", text="Context B waits its turn.", context_id="b")
        await send(ws, type="input.done", context_id="a")
        await send(ws, type="input.done", context_id="b")
        t = await recv_until(ws, Transcript(), count=2)
        _check_pairing(t)
        starts = t.of("audio.start")
        assert [s["context_id"] for s in starts] == ["a", "b"]
        assert {d["context_id"] for d in t.of("session.done")} == {"a", "b"}


async def test_two_contexts_tagged_framing(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", framing="tagged", **LOW_LATENCY)
        texts = {"a": "Context A has a sentence to say.", "b": "Context B talks at the same time."}
        for cid, text in texts.items():
            await send(ws, type="input.text", text=text, context_id=cid)
            await send(ws, type="input.done", context_id=cid)
        t = await recv_until(ws, Transcript(), count=2)
        numbers = {s["context_number"]: s["context_id"] for s in t.of("audio.start")}
        assert len(numbers) == 2
        per_context: dict[str, list[tuple[int, int, int]]] = {"a": [], "b": []}
        for frame in t.binary:
            header, payload = unpack_frame(frame)
            per_context[numbers[header.context]].append(
                (header.sequence, header.sample_offset, len(payload) // 2)
            )
        for frames in per_context.values():
            assert [f[0] for f in frames] == list(range(len(frames)))
            offset = 0
            for _, sample_offset, n in frames:
                assert sample_offset == offset
                offset += n
        done = {d["context_id"]: d for d in t.of("session.done")}
        for cid, frames in per_context.items():
            total = sum(n for _, _, n in frames)
            assert abs(total / 22050 * 1000 - done[cid]["metrics"]["audio_ms"]) < 1


# --------------------------------------------------------------------------
# audio output
# --------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [8000, 48000])
@pytest.mark.parametrize("encoding", ["pcm_s16le", "pcm_f32le", "mulaw", "alaw"])
async def test_resampled_encoded_frames(
    piper_server: RunningServer, rate: int, encoding: str
) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", sample_rate=rate, encoding=encoding, **LOW_LATENCY)
        await send(ws, type="input.text", text="Testing one two three.")
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
        start = t.of("audio.start")[0]
        assert start["sample_rate"] == rate and start["encoding"] == encoding
        width = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1, "alaw": 1}[encoding]
        frames = t.binary
        per_frame = round(rate * 20 / 1000)
        assert all(len(f) == per_frame * width for f in frames[:-1])
        assert 0 < len(frames[-1]) <= per_frame * width
        audio = decode(b"".join(frames), encoding)
        assert np.sqrt(np.mean(audio**2)) > 0.01
        assert t.of("audio.done")[0]["total_bytes"] == sum(len(f) for f in frames)


async def test_streamed_wav_header_message(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", response_format="wav", stream_audio=True)
        await send(ws, type="input.text", text="A streamed wave file.")
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
        header, *frames = t.binary
        assert header[:4] == b"RIFF" and header[8:12] == b"WAVE" and len(header) == 44
        assert t.of("audio.done")[0]["total_bytes"] == len(header) + sum(map(len, frames))
        audio, rate = sf.read(io.BytesIO(b"".join(t.binary)), dtype="float32")
        assert rate == 22050 and len(audio) > 5000


async def test_alignment_precedes_audio(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(
            ws, type="session.config", timestamps=True, split_granularity="sentence", **LOW_LATENCY
        )
        await send(ws, type="input.text", text="One sentence here. Another one there.")
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
        types = t.types()
        for start_index in [i for i, k in enumerate(types) if k == "audio.start"]:
            assert types[start_index + 1] == "alignment"
        alignments = t.of("alignment")
        assert [w["word"] for w in alignments[0]["words"]] == ["One", "sentence", "here."]
        second_start = alignments[1]["words"][0]["start_ms"]
        first_audio = t.of("audio.done")[0]["audio_ms"]
        assert second_start >= first_audio - 1  # utterance-relative times


# --------------------------------------------------------------------------
# errors from the registry
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{not json", "invalid_json"),
        ("[1, 2]", "invalid_message"),
        ('{"text": "no type"}', "invalid_message"),
        ('{"type": "input.text", "text": 5}', "invalid_message"),
        ('{"type": "no.such.thing"}', "unknown_type"),
    ],
)
async def test_malformed_messages_are_not_fatal(
    piper_server: RunningServer, frame: str, code: str
) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await ws.send(frame)
        error = json.loads(await ws.recv())
        assert error == {**error, "type": "error", "code": code, "fatal": False}
        await send(ws, type="ping", id=7)
        assert json.loads(await ws.recv()) == {"type": "pong", "id": 7}


async def test_schema_error_names_the_field(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", speed=9)
        error = json.loads(await ws.recv())
        assert error["code"] == "invalid_config" and "$.speed" in error["message"]


@pytest.mark.parametrize(
    ("config", "code", "needle"),
    [
        ({"voice": "joe", "speaker": "other"}, "invalid_config", "speaker"),
        ({"flow_control": "ack"}, "invalid_config", "stream_audio"),
        ({"task_type": "VoiceDesign"}, "unsupported_option", "task_type"),
        ({"instructions": "whisper"}, "unsupported_option", "instructions"),
        ({"ref_audio": "data:audio/wav;base64,AAAA"}, "unsupported_option", "ref_audio"),
        ({"ref_text": "hello"}, "unsupported_option", "ref_text"),
        ({"x_vector_only_mode": True}, "unsupported_option", "x_vector_only_mode"),
        ({"speaker_embedding": [0.1, 0.2]}, "unsupported_option", "speaker_embedding"),
        ({"word_timestamps": True}, "invalid_config", "stream_audio"),
        ({"language": "German"}, "unsupported_option", "language"),
        ({"model": "gpt-5"}, "invalid_config", "model"),
    ],
)
async def test_rejected_first_config_is_fatal(
    piper_server: RunningServer, config: dict[str, object], code: str, needle: str
) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", **config)
        error = json.loads(await ws.recv())
        assert error["code"] == code and error["fatal"] is True
        assert needle in error["message"]
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_later_rejected_config_changes_nothing(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", sample_rate=16000, **LOW_LATENCY)
        assert json.loads(await ws.recv())["type"] == "session.updated"
        await send(ws, type="session.config", sample_rate=8000, voice="nobody")
        error = json.loads(await ws.recv())
        assert error["code"] == "unknown_voice" and error["fatal"] is False
        await send(ws, type="input.text", text="Still sixteen kilohertz.")
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
        assert t.of("audio.start")[0]["sample_rate"] == 16000


@pytest.mark.parametrize(
    "config",
    [
        {"task_type": "CustomVoice"},
        {"instructions": ""},
        {"ref_audio": None, "ref_text": None},
        {"x_vector_only_mode": False, "non_streaming_mode": False},
        {"max_new_tokens": 2048, "initial_codec_chunk_frames": 0},
        {"word_timestamps": False, "speaker_embedding": None},
        {"language": "Auto", "speed": 1.0, "model": "tts-1"},
        {"language": "en_US"},
        {"language": "English"},
        {"speaker": "joe"},
    ],
)
async def test_vllm_omni_default_fields_are_accepted(
    piper_server: RunningServer, config: dict[str, object]
) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", **config)
        assert json.loads(await ws.recv())["type"] == "session.updated"


async def test_text_too_long(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(max_input_text_bytes=100, max_utterance_chars=150)
    ws, _ = await _session(server)
    async with ws:
        await send(ws, type="input.text", text="x" * 101)
        error = json.loads(await ws.recv())
        assert error["code"] == "text_too_long" and not error["fatal"]
        await send(ws, type="input.text", text="word " * 20)
        await send(ws, type="input.text", text="word " * 20)
        t = await recv_until(ws, Transcript(), stop="error")
        assert t.of("error")[0]["code"] == "text_too_long"


async def test_invalid_state_framing_change_mid_utterance(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.config", split_granularity="none", **LOW_LATENCY)
        await ws.recv()
        await send(ws, type="input.text", text="Waiting for more")
        await send(ws, type="session.config", framing="tagged")
        error = json.loads(await ws.recv())
        assert error["code"] == "invalid_state" and not error["fatal"]


async def test_too_many_contexts(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(max_contexts=2)
    ws, _ = await _session(server)
    async with ws:
        await send(ws, type="session.config", split_granularity="none", **LOW_LATENCY)
        await ws.recv()
        for cid in ("a", "b", "c"):
            await send(ws, type="input.text", text="pending text", context_id=cid)
        error = json.loads(await ws.recv())
        assert error["code"] == "invalid_state" and "contexts" in error["message"]
        assert error["context_id"] == "c"


async def test_sentence_failure_ends_sentence_and_session_goes_on(
    piper_engine: Engine, server_factory: Callable[..., RunningServer]
) -> None:
    server = server_factory(engine=FailOnMarkerEngine(piper_engine, after_chunks=2))
    ws, _ = await _session(server)
    async with ws:
        await send(ws, type="session.config", split_granularity="sentence", **LOW_LATENCY)
        text = (
            f"This sentence is fine. This one {FAIL_MARKER} breaks down midway. The last is fine."
        )
        await send(ws, type="input.text", text=text)
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
        done = t.of("audio.done")
        assert [d["error"] for d in done] == [False, True, False]
        error = t.of("error")[0]
        assert error["code"] == "internal" and error["partial_audio"] is True and not error["fatal"]
        assert t.of("session.done")[0]["total_sentences"] == 3
        _check_pairing(t)


async def test_config_timeout(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(config_timeout_s=0.3)
    ws, _ = await _session(server)
    async with ws:
        error = json.loads(await ws.recv())
        assert error["code"] == "timeout" and error["fatal"]
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001


async def test_busy_when_sessions_exhausted(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(max_sessions=1, max_sessions_per_client=1)
    first, _ = await _session(server)
    async with first, await open_ws(server.ws_url) as second:
        error = json.loads(await second.recv())
        assert error["code"] == "busy" and error["fatal"]
        with pytest.raises(ConnectionClosed) as closed:
            await second.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013


async def test_session_close_answers_1000(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await send(ws, type="session.close")
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


async def test_binary_from_client_is_rejected(piper_server: RunningServer) -> None:
    ws, _ = await _session(piper_server)
    async with ws:
        await ws.send(b"\x00\x01")
        error = json.loads(await ws.recv())
        assert error["code"] == "invalid_message" and not error["fatal"]


async def test_health_ready_metrics(piper_server: RunningServer) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=piper_server.http) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).json()["status"] == "ready"
        text = (await client.get("/metrics")).text
        for name in (
            "gateway_sessions_active",
            "gateway_time_to_first_audio_seconds",
            "gateway_engine_queue_depth",
            "gateway_event_loop_lag_seconds",
            "gateway_errors_total",
        ):
            assert name in text
        assert "session_id" not in text


async def test_concurrent_sessions_are_isolated(piper_server: RunningServer) -> None:
    async def one(text: str) -> Transcript:
        ws, _ = await _session(piper_server)
        async with ws:
            await send(ws, type="session.config", **LOW_LATENCY)
            await send(ws, type="input.text", text=text)
            await send(ws, type="input.done")
            return await recv_until(ws, Transcript())

    results = await asyncio.gather(*(one(f"Session number {i} is speaking.") for i in range(3)))
    for i, t in enumerate(results):
        assert t.of("audio.start")[0]["sentence_text"] == f"Session number {i} is speaking."
