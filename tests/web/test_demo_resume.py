"""The demo page rides out a network blip (protocol 2.1.0 resume): real
headless Chromium, a real gateway (Piper), and ``tests/faultproxy.py``
between them, which drops every connection mid-reply and refuses new ones
for a while.  The client resumes the session by itself: the audio goes on
into the same player, sequence numbers and sample offsets continue, no
sample is repeated or skipped, and the page says so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import RunningServer
from tests.faultproxy import FaultProxy
from tests.web.test_demo_page import wait_until

TEXT = (
    "The old lighthouse stood at the edge of the cliff for a hundred years. "
    "Every night its lamp turned slowly over the dark water."
)


def _browser_noise(message: str) -> bool:
    """Chromium's own console line for each try that found the port closed."""
    return message.startswith("WebSocket connection to")


def test_a_cut_mid_reply_resumes_and_the_audio_goes_on(
    server_factory: Callable[..., RunningServer], open_demo: Any, artifacts: Path
) -> None:
    server = server_factory(resume_window_s=30)
    proxy = FaultProxy(int(server.http.rsplit(":", 1)[1]))
    try:
        demo = open_demo(proxy.url)
        page = demo.page
        rate = page.evaluate("demo.player.sampleRate")
        # tagged framing: every frame carries its sequence number and offset
        page.evaluate("demo.client.configure({ framing: 'tagged' })")
        page.evaluate(
            """(text) => {
            demo.frames = [];
            demo.done = [];
            // ahead of the player, which hands the samples to its worklet
            const audio = demo.client.handlers.get("audio");
            const player = [...audio];
            audio.clear();
            demo.client.on("audio", (a) => demo.frames.push(
                [a.contextId, a.utteranceIndex, a.sequence, a.offset, a.samples.length]));
            player.forEach((h) => audio.add(h));
            demo.client.on("audio.done", (m) => demo.done.push(m));
            demo.client.on("resumed", () => (demo.framesAtResume = demo.frames.length));
            demo.renderedAtStart = demo.player.stats ? demo.player.stats.rendered : 0;
            demo.client.sendText(text);
            demo.client.done();
        }""",
            TEXT,
        )
        # half a second of audio in, then the link goes down: every
        # connection is dropped and new ones are refused for a while
        wait_until(page, "demo.frames.length >= 25", 60)
        assert not demo.events("session.done")
        proxy.refuse()
        wait_until(page, "demo.log.filter((e) => e.type === 'resuming').length >= 2", 10)
        assert page.text_content("#status") == "connection lost, resuming…"
        page.screenshot(path=str(artifacts / "demo-resuming.png"))
        proxy.resume()

        wait_until(page, "document.querySelector('#link').textContent.startsWith('resumed')", 30)
        wait_until(page, "demo.log.some((e) => e.type === 'session.done')", 60)
        assert page.text_content("#status") == "open"
        page.screenshot(path=str(artifacts / "demo-resumed.png"))

        frames = page.evaluate("demo.frames")
        done = page.evaluate("demo.done")
        at_resume = page.evaluate("demo.framesAtResume")
        assert 25 <= at_resume < len(frames), "the cut landed mid-reply"
        # one context, one utterance: sequence numbers from 0 without a gap,
        # each frame's offset where the one before it ended
        assert {(f[0], f[1]) for f in frames} == {(None, 0)}
        assert [f[2] for f in frames] == list(range(len(frames)))
        offsets = [0]
        for f in frames:
            assert f[3] == offsets[-1], f
            offsets.append(f[3] + f[4])
        # events were counted too: none came twice
        sentences = [(d["utterance_index"], d["sentence_index"]) for d in done]
        assert len(sentences) == len(set(sentences)) == 2
        assert offsets[-1] * 2 == sum(d["total_bytes"] for d in done)
        (finished,) = demo.events("session.done")
        assert demo.events("resumed") and not demo.events("resume_failed")
        assert not demo.events("audio.cancelled")
        # the same player played it all, to the end (20 ms for the last quantum)
        expected = offsets[-1]
        wait_until(
            page,
            f"demo.player.stats.rendered - demo.renderedAtStart >= {expected - rate * 0.02}",
            30,
        )
        assert finished["utterance_index"] == 0
        errors = [e for e in demo.console_errors if not _browser_noise(e)]
        assert errors == []
        assert page.text_content("#errors") == ""
    finally:
        proxy.close()


def test_text_streamed_across_a_cut_is_spoken_once_and_whole(
    server_factory: Callable[..., RunningServer], open_demo: Any
) -> None:
    """The paragraph button streams tokens while the link is down: the
    tokens in flight when it dropped and those written meanwhile reach the
    server after the resume (what ``text_chars`` says it lacks), so every
    word is spoken, once, in one utterance."""
    server = server_factory(resume_window_s=30)
    proxy = FaultProxy(int(server.http.rsplit(":", 1)[1]))
    try:
        demo = open_demo(proxy.url)
        page = demo.page
        page.evaluate(
            """(text) => {
            demo.sentences = [];
            demo.failed = [];
            demo.client.on("audio.start", (m) => demo.sentences.push(m.sentence_text));
            demo.client.on("text.failed", (f) => demo.failed.push(f.text));
            demo.streamParagraph(text, 10);  // 10 tokens a second
        }""",
            TEXT,
        )
        wait_until(page, "demo.log.filter((e) => e.type === 'sent:input.text').length >= 8", 30)
        proxy.refuse()
        # four tries: at least 350 ms down, some tokens written meanwhile
        wait_until(page, "demo.log.filter((e) => e.type === 'resuming').length >= 4", 10)
        proxy.resume()
        wait_until(page, "demo.log.some((e) => e.type === 'session.done')", 90)
        assert page.evaluate("demo.failed") == []
        (resumed,) = demo.events("resumed")
        assert resumed["resent"] > 0, "text written while down went out after the resume"
        assert not demo.events("resume_failed")
        spoken = " ".join(page.evaluate("demo.sentences"))
        assert spoken.split() == TEXT.split()
        (finished,) = demo.events("session.done")
        assert finished["context_id"] == "llm"
        errors = [e for e in demo.console_errors if not _browser_noise(e)]
        assert errors == []
    finally:
        proxy.close()


def test_past_the_window_the_page_falls_back_to_a_new_session(
    server_factory: Callable[..., RunningServer], open_demo: Any
) -> None:
    """Down longer than ``resume_window_s``: the client stops trying, reports
    the unfinished text as not spoken, and opens a new session."""
    server = server_factory(resume_window_s=1)
    proxy = FaultProxy(int(server.http.rsplit(":", 1)[1]))
    try:
        demo = open_demo(proxy.url)
        page = demo.page
        first = page.evaluate("demo.client.session.session_id")
        page.evaluate("demo.client.sendText('Still typing this ')")
        proxy.refuse()
        wait_until(page, "demo.log.some((e) => e.type === 'resume_failed')", 10)
        proxy.resume()
        wait_until(page, "demo.client.state === 'open'", 30)
        errors = page.text_content("#errors") or ""
        assert "resume failed" in errors and "not spoken" in errors
        assert "Still typing this" in errors
        assert page.evaluate("demo.client.session.session_id") != first
        assert not demo.events("resumed")
    finally:
        proxy.close()
