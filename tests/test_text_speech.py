"""The text front-end through a real server (uvicorn on loopback, Piper):
what the engine is given, the controls over HTTP with the openai SDK, and
reports on the client's text (word offsets, cancel reports, nothing lost).

The engine is the session's real Piper engine, wrapped so the test can read
the text each segment submitted (``RecordingEngine``)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from gateway.app import create_app
from gateway.engines.base import (
    Engine,
    EngineStream,
    SegmentRequest,
    SynthesisJob,
)
from gateway.settings import SettingsError
from gateway.text.segmenter import Segmenter
from gateway.text.whole_text import speakable_segments
from tests.conftest import RunningServer
from tests.conftest import test_settings as make_settings
from tests.helpers import DelegatingEngine, Transcript, open_ws, recv_until, send
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


class RecordingEngine(DelegatingEngine):
    """A real engine whose submitted segment texts are recorded, in order."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.texts: list[str] = []

    def wrap(self, stream: EngineStream) -> EngineStream:
        return _RecordingStream(stream, self.texts)


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


#: REPLY as a person would read it (the spoken form, written by hand)
REPLY_SPOKEN = (
    "Sure! Step one: open the app and pay five dollars. Then tap Settings, and see the docs. Done."
)


def _audio_ms(t: Transcript) -> float:
    return sum(float(d["audio_ms"]) for d in t.of("audio.done"))


async def test_a_markdown_reply_streamed_as_tokens_is_spoken_without_markup(
    piper_server: RunningServer,
) -> None:
    """Judged by the audio's length against the spoken form's (Piper
    deterministic): at most 1.15x, where reading the markup aloud is far over."""
    common: dict[str, Any] = {"response_format": "pcm", "stream_audio": True}
    markdown = await _speak(piper_server, _tokens(REPLY), **common)
    spoken = await _speak(
        piper_server, [REPLY_SPOKEN], input_format="plain", normalize=False, **common
    )
    literal = await _speak(
        piper_server, _tokens(REPLY), input_format="plain", normalize=False, **common
    )
    ratio = _audio_ms(markdown) / _audio_ms(spoken)
    assert ratio <= 1.15, ratio
    assert _audio_ms(literal) / _audio_ms(spoken) > 1.3  # the markup, read aloud
    # reports stay on the client's text: nothing lost
    texts = [s["sentence_text"] for s in markdown.of("audio.start")]
    assert _collapse(" ".join(texts)) == _collapse(REPLY)


async def test_a_segment_with_nothing_to_speak_is_a_sentence_of_no_audio(
    piper_server: RunningServer,
) -> None:
    text = "Here is the code:\n\n```python\nprint(1)\n```\n\n😀 👍\n\nDone."
    t = await _speak(
        piper_server, _tokens(text), response_format="pcm", stream_audio=True, timestamps=True
    )
    starts = t.of("audio.start")
    dones = {d["sentence_index"]: d for d in t.of("audio.done")}
    assert _collapse(" ".join(s["sentence_text"] for s in starts)) == _collapse(text)
    # the code block (skipped) and the emoji after it (dropped) are not spoken
    silent = [s for s in starts if s["sentence_text"].startswith(("```", "print(1)"))]
    assert len(silent) == 2 and "😀 👍" in silent[1]["sentence_text"]
    for start in silent:
        done = dones[start["sentence_index"]]
        assert done["audio_ms"] == 0 and done["total_bytes"] == 0 and not done["error"]
    assert all(dones[s["sentence_index"]]["audio_ms"] > 0 for s in starts if s not in silent)
    (session_done,) = t.of("session.done")
    assert session_done["total_sentences"] == len(starts)


BAD_SSML = (
    '<speak>Hello there. <say-as interpret-as="digits">12</b> and more. Then this is said.</speak>'
)


async def test_bad_ssml_is_an_error_naming_the_position_and_the_rest_is_spoken(
    piper_server: RunningServer,
) -> None:
    t = await _speak(
        piper_server,
        _tokens(BAD_SSML),
        input_format="ssml",
        split_granularity="sentence",
        response_format="pcm",
        stream_audio=True,
        debug_engine_text=True,
    )
    (error,) = t.of("error")
    assert error["code"] == "invalid_ssml" and not error["fatal"]
    position = BAD_SSML.index("</b>")
    assert f"character {position}" in error["message"]
    starts = t.of("audio.start")
    dones = {d["sentence_index"]: d for d in t.of("audio.done")}
    # the sentence before it is spoken, without its tags
    assert starts[0]["engine_text"].strip() == "Hello there."
    assert dones[0]["audio_ms"] > 0
    # the bad sentence comes after the error; it and the rest of the
    # utterance (whose markup state is unknown) are reported with no audio
    bad = next(s for s in starts if "</b>" in s["sentence_text"])
    assert t.items.index(error) < t.items.index(bad)
    assert all(dones[s["sentence_index"]]["audio_ms"] == 0 for s in starts[1:])
    assert _collapse(" ".join(s["sentence_text"] for s in starts)) == _collapse(BAD_SSML)
    assert t.of("session.done")


def test_http_bad_ssml_is_400_naming_the_position(piper_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=piper_server.http + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(
            model="tts-1", voice="alloy", input=BAD_SSML, extra_body={"input_format": "ssml"}
        ).read()
    body = info.value.body
    assert isinstance(body, dict) and body["code"] == "invalid_ssml"
    assert f"character {BAD_SSML.index('</b>')}" in body["message"]


async def test_an_ssml_break_is_silence_made_by_the_gateway(
    piper_server: RunningServer,
) -> None:
    common: dict[str, Any] = {
        "input_format": "ssml",
        "response_format": "pcm",
        "stream_audio": True,
        "split_granularity": "sentence",
    }
    plain = await _speak(piper_server, ["<speak>Hello there. See you.</speak>"], **common)
    paused = await _speak(
        piper_server, ['<speak>Hello there. <break time="1s"/>See you.</speak>'], **common
    )
    added = _audio_ms(paused) - _audio_ms(plain)
    assert 950 <= added <= 1050, added


async def test_a_break_inside_a_sentence_is_heard_where_it_stands(
    piper_server: RunningServer,
) -> None:
    """The segmenter cuts after a ``<break>``, so its silence (exact zeros,
    made by the gateway) closes the audio of the words before it, and the
    words after it start the next sentence."""
    t = await _speak(
        piper_server,
        list('<speak>Hello there <break time="1s"/> my friend.</speak>'),
        input_format="ssml",
        response_format="pcm",
        stream_audio=True,
        split_granularity="sentence",
    )
    texts = [s["sentence_text"] for s in t.of("audio.start")]
    assert texts == ['<speak>Hello there <break time="1s"/>', "my friend.</speak>"]
    first: list[bytes] = []
    for item in t.items[t.items.index(t.of("audio.start")[0]) + 1 :]:
        if isinstance(item, dict) and item["type"] == "audio.start":
            break
        if isinstance(item, bytes):
            first.append(item)
    samples = np.frombuffer(b"".join(first), "<i2")
    rate = t.of("audio.start")[0]["sample_rate"]
    tail = samples[-int(0.95 * rate) :]
    assert samples.size > rate and not tail.any()  # speech, then the pause
    assert samples[: samples.size - rate].any()


async def test_the_server_lexicon_and_the_sessions_pronunciations(
    server_factory: Any, tmp_path: Any
) -> None:
    lexicon = tmp_path / "lexicon.txt"
    lexicon.write_text("# the server's words\nGIF\tjiff\nSQL\tsequel\n", encoding="utf-8")
    server = server_factory(lexicon_file=str(lexicon))
    t = await _speak(
        server,
        ["Send the GIF from SQL."],
        pronunciations={"SQL": "ess cue ell"},
        debug_engine_text=True,
        response_format="pcm",
        stream_audio=True,
    )
    (start,) = t.of("audio.start")
    assert start["sentence_text"] == "Send the GIF from SQL."
    # the session's entry wins over the server's
    assert start["engine_text"] == "Send the jiff from ess cue ell."


def test_a_malformed_lexicon_file_stops_the_start(tmp_path: Any, piper_engine: Engine) -> None:

    lexicon = tmp_path / "lexicon.txt"
    lexicon.write_text("GIF\tjiff\nno separator\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="line 2"):
        create_app(make_settings(lexicon_file=str(lexicon)), engine=piper_engine)


def test_batch_items_take_the_text_controls(
    server_factory: Any, recording: RecordingEngine
) -> None:
    server = server_factory(engine=recording)
    response = httpx.post(
        server.http + "/v1/audio/speech/batch/gateway",
        json={
            "model": "tts-1",
            "voice": "alloy",
            "response_format": "wav",
            "input_format": "plain",
            "normalize": False,
            "items": [{"input": "Pay **$5** now."}, {"input": "Bad.", "emoji": "keep"}],
        },
        timeout=120,
    )
    results = response.json()["data"]
    assert results[0]["status"] == "ok" and recording.texts == ["Pay **$5** now."]
    assert results[1]["status"] == "error"
    assert results[1]["error"]["code"] == "invalid_config"


# --- issue 28: readings that were an HTTP 500 or a false invalid_ssml ---------------

SUPERSCRIPT_SSML = '<speak>One. <say-as interpret-as="digits">1\u00b2</say-as> two. Three.</speak>'
LONG_ALIAS = "World Wide Web " * 20
LONG_SSML = [
    "<speak>" + "&#x4E2D;&#x6587;" * 30 + " ok.</speak>",
    '<speak>Say <sub alias="' + LONG_ALIAS + '">WWW</sub> ok.</speak>',
]


@pytest.mark.parametrize(
    ("text", "input_format"),
    [
        ("See https://example.com/x\u00b2 now.", "markdown"),
        ("Mail https://e.co/\u2460 today.", "plain"),
        (SUPERSCRIPT_SSML, "ssml"),
        *[(text, "ssml") for text in LONG_SSML],
    ],
)
def test_http_digits_of_any_form_and_long_ssml_are_spoken(
    piper_server: RunningServer, text: str, input_format: str
) -> None:
    """Each was a 500 ``internal`` (a ValueError reading ``²``) or a false
    400 ``invalid_ssml`` (the segment cap cut a character reference)."""
    client = openai.OpenAI(base_url=piper_server.http + "/v1", api_key=API_KEY, max_retries=0)
    audio = client.audio.speech.create(
        model="tts-1",
        voice="alloy",
        input=text,
        response_format="wav",
        extra_body={"input_format": input_format},
    ).read()
    assert audio[:4] == b"RIFF" and len(audio) > 1000


async def test_ws_ssml_with_a_superscript_digit_is_spoken_and_the_next_sentence_too(
    piper_server: RunningServer,
) -> None:
    """On main the ValueError spoke the tags and refused the next, valid
    sentence with a false ``invalid_ssml``."""
    t = await _speak(
        piper_server,
        _tokens(SUPERSCRIPT_SSML),
        input_format="ssml",
        response_format="pcm",
        stream_audio=True,
        debug_engine_text=True,
    )
    assert not t.of("error")
    spoken = _collapse(" ".join(s["engine_text"] for s in t.of("audio.start")))
    assert spoken == "One. one two two. Three."
    assert t.of("session.done")


@pytest.mark.parametrize("text", LONG_SSML)
async def test_ws_long_ssml_markup_is_never_cut_inside(
    piper_server: RunningServer, text: str
) -> None:
    t = await _speak(
        piper_server,
        [text],
        input_format="ssml",
        response_format="pcm",
        stream_audio=True,
        debug_engine_text=True,
    )
    assert not t.of("error")
    spoken = _collapse(" ".join(s["engine_text"] for s in t.of("audio.start")))
    assert "WorldWide" not in spoken and "&#" not in spoken and spoken.endswith("ok.")


async def test_ws_link_reference_definitions_are_silent(piper_server: RunningServer) -> None:
    text = "".join(f"[r{i}]: https://e.co/{i}\n" for i in range(30)) + "Done."
    t = await _speak(
        piper_server, [text], response_format="pcm", stream_audio=True, debug_engine_text=True
    )
    assert not t.of("error")
    spoken = _collapse(" ".join(s["engine_text"] for s in t.of("audio.start")))
    assert spoken == "Done."
    starts = t.of("audio.start")
    assert starts[0]["sentence_text"] == "[r0]: https://e.co/0"
