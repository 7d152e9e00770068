"""The text front-end through a real server (uvicorn on loopback, Piper):
what the engine is given, the controls over HTTP with the openai SDK, and
reports on the client's text (word offsets, cancel reports, nothing lost).

The engine is the session's real Piper engine, wrapped so the test can read
the text each segment submitted (``RecordingEngine``)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

import openai
import pytest

from gateway.engines.base import (
    Capabilities,
    Engine,
    EngineStream,
    SegmentRequest,
    StreamRequest,
    SynthesisJob,
    VoiceInfo,
)
from gateway.text.queue import speakable_segments
from gateway.text.segmenter import Segmenter
from tests.conftest import RunningServer
from tests.helpers import Transcript, open_ws, recv_until, send
from tests.http.helpers import API_KEY

#: an assistant's Markdown reply, with what Piper would read literally
REPLY = (
    "Sure! **Step 1:** open the app and pay $5.\n\n"
    "Then tap *Settings* 😀, and see [the docs](https://example.com/docs/setup). Done."
)


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _tokens(text: str) -> list[str]:
    """LLM-like pieces: words with their spaces, markers split off."""
    return re.findall(r"\*\*|\S+?(?=\*\*|\s|$)|\s+", text)


class _RecordingStream(EngineStream):
    def __init__(self, inner: EngineStream, texts: list[str]) -> None:
        self.inner = inner
        self.request = inner.request
        self.texts = texts

    def submit(self, segment: SegmentRequest) -> SynthesisJob:
        self.texts.append(segment.text)
        return self.inner.submit(segment)

    def cancel(self) -> None:
        self.inner.cancel()

    def close(self) -> None:
        self.inner.close()


class RecordingEngine(Engine):
    """A real engine whose submitted segment texts are recorded, in order."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner.settings)
        self.inner = inner
        self.name = inner.name
        self.texts: list[str] = []

    async def start(self) -> None:
        return None

    def voices(self) -> Sequence[VoiceInfo]:
        return self.inner.voices()

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    def open_stream(self, request: StreamRequest) -> EngineStream:
        return _RecordingStream(self.inner.open_stream(request), self.texts)

    def live_jobs(self) -> int:
        return self.inner.live_jobs()


@pytest.fixture
def recording(piper_engine: Engine) -> RecordingEngine:
    return RecordingEngine(piper_engine)


async def _speak(server: RunningServer, pieces: list[str], **config: Any) -> Transcript:
    async with await open_ws(server.ws_url) as ws:
        await ws.recv()
        await send(ws, type="session.config", **config)
        await ws.recv()
        for piece in pieces:
            await send(ws, type="input.text", text=piece)
        await send(ws, type="input.done")
        return await recv_until(ws, Transcript())


async def test_plain_without_normalization_is_todays_engine_input(
    server_factory: Any, recording: RecordingEngine
) -> None:
    """``plain`` + ``normalize: false``: the engine reads exactly the
    segments the segmenter committed, as before the front-end existed."""
    server = server_factory(engine=recording)
    t = await _speak(
        server,
        _tokens(REPLY),
        input_format="plain",
        normalize=False,
        split_granularity="sentence",
        response_format="pcm",
        stream_audio=True,
    )
    segmenter = Segmenter("sentence", max_chars=server.settings.max_segment_chars)
    expected = segmenter.push(REPLY) + segmenter.flush()
    assert recording.texts == expected
    assert [s["sentence_text"] for s in t.of("audio.start")] == expected


def test_http_plain_without_normalization_with_the_openai_sdk(
    server_factory: Any, recording: RecordingEngine
) -> None:
    server = server_factory(engine=recording)
    client = openai.OpenAI(base_url=server.http + "/v1", api_key=API_KEY, max_retries=0)
    audio = client.audio.speech.create(
        model="tts-1",
        voice="alloy",
        input=REPLY,
        response_format="wav",
        extra_body={"input_format": "plain", "normalize": False},
    ).read()
    assert audio[:4] == b"RIFF"
    assert recording.texts == speakable_segments(REPLY, server.settings.max_segment_chars)
    # the same shape with the controls left out (markdown, normalized)
    recording.texts.clear()
    assert (
        client.audio.speech.create(
            model="tts-1", voice="alloy", input=REPLY, response_format="wav"
        ).read()[:4]
        == b"RIFF"
    )
    assert recording.texts  # spoken; what the front-end made of it is its own test


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"input_format": "html"}, "input_format"),
        ({"emoji": "keep"}, "emoji"),
        ({"pronunciations": {"": "x"}}, "pronunciations"),
    ],
)
def test_http_bad_text_controls_are_invalid_config(
    piper_server: RunningServer, extra: dict[str, Any], param: str
) -> None:
    client = openai.OpenAI(base_url=piper_server.http + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(
            model="tts-1", voice="alloy", input="Hello.", extra_body=extra
        ).read()
    body = info.value.body
    assert isinstance(body, dict)
    assert body["code"] == "invalid_config" and body["param"] == param


async def test_timings_and_cancel_report_name_the_client_words(
    piper_server: RunningServer,
) -> None:
    """Word timings carry the client's words and their offsets; after a
    cancel, heard + unheard is the client's text."""
    async with await open_ws(piper_server.ws_url) as ws:
        await ws.recv()
        await send(
            ws,
            type="session.config",
            response_format="pcm",
            stream_audio=True,
            timestamps=True,
            flow_control="ack",
            max_lead_ms=60_000,
            split_granularity="sentence",
        )
        await ws.recv()
        for piece in _tokens(REPLY):
            await send(ws, type="input.text", text=piece)
        await send(ws, type="input.flush")
        # the second sentence is all sent (the report never counts past that)
        t = await recv_until(ws, Transcript(), stop="audio.done", count=2)
        first, words = (a["words"] for a in t.of("alignment"))
        # the listener heard the first sentence and three words of the second
        await send(ws, type="playback", played_ms=words[2]["end_ms"] - 1)
        await asyncio.sleep(0.05)
        await send(ws, type="cancel")
        t = await recv_until(ws, t)
    for word in [*first, *words]:
        assert REPLY[word["char_start"] : word["char_end"]] == word["word"]
    (report,) = t.of("audio.cancelled")
    heard, unheard = report["spoken_text"], report["unspoken_text"]
    assert _collapse(f"{heard} {unheard}") == _collapse(REPLY)
    assert heard == REPLY[: words[2]["char_end"]].strip()
