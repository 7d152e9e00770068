"""The demo page in real headless Chromium against a real gateway (Piper).

Audio is counted inside the AudioWorklet (samples on the audio clock), never
by wall time: the worklet's report gives ``rendered`` (samples played from
the buffer), ``nonSilent``, ``underruns`` and the counts at the last cancel.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

TYPED = (
    "so here is the thing I wanted to tell you about the trip we took last summer "
    "to the coast where the weather was kind and the sea stayed calm"
)
WORDS = TYPED.split()


def wait_until(page: Any, expression: str, timeout_s: float = 30.0) -> Any:
    return page.wait_for_function(expression, timeout=timeout_s * 1000).json_value()


def test_page_loads_without_console_errors(piper_server: Any, open_demo: Any) -> None:
    demo = open_demo(piper_server.http)
    page = demo.page
    assert page.text_content("#status") == "open"
    voices = page.eval_on_selector_all("#voice option", "os => os.map(o => o.value)")
    assert voices == [v.name for v in piper_server.state.engine.voices()]
    config = page.evaluate("demo.client.config")
    rate = page.evaluate("demo.player.sampleRate")
    assert config["sample_rate"] == rate
    assert config["flow_control"] == "ack"
    assert (config["response_format"], config["stream_audio"], config["frame_ms"]) == (
        "pcm",
        True,
        20,
    )
    assert page.evaluate("demo.player.context.state") == "running"
    time.sleep(0.3)
    assert demo.console_errors == []


def test_typing_speaks_before_the_last_word(piper_server: Any, open_demo: Any) -> None:
    demo = open_demo(piper_server.http)
    page = demo.page
    page.click("#text")
    assert len(WORDS) == 30
    started = time.monotonic()
    audio_before_last = None
    for i, word in enumerate(WORDS):
        if i == len(WORDS) - 1:
            audio_before_last = len(demo.events("audio.start"))
        page.keyboard.type(word + " ")
        # 5 words per second, on the wall clock of the typist
        time.sleep(max(0.0, started + (i + 1) * 0.2 - time.monotonic()))
    assert audio_before_last, "no audio.start before the last word was typed"
    sent = demo.events("sent:input.text")
    assert len(sent) >= len(WORDS) - 1, "text must leave word by word, not on Enter"
    page.keyboard.press("Enter")
    wait_until(page, "demo.log.some((e) => e.type === 'session.done')", 60)
    assert demo.console_errors == []


def test_paragraph_plays_highlights_and_stops(
    piper_server: Any, open_demo: Any, artifacts: Path
) -> None:
    demo = open_demo(piper_server.http)
    page = demo.page
    rate = page.evaluate("demo.player.sampleRate")
    page.click("#paragraph")
    # at least 2 s rendered by the worklet from the jitter buffer
    wait_until(page, f"demo.player.stats && demo.player.stats.rendered >= {2 * rate}", 60)
    assert re.fullmatch(r"\d+", page.text_content("#ttfa") or ""), "time to first audio not shown"
    wait_until(page, "document.querySelector('.transcript .word.current') !== null", 10)
    highlighted = page.text_content(".transcript .word.current")
    assert highlighted and highlighted.strip() in page.evaluate(
        "demo.log.filter(e => e.type === 'sent:input.text').map(e => e.text).join('')"
    )
    page.screenshot(path=str(artifacts / "demo-speaking.png"))

    page.click("#stop")
    wait_until(page, "demo.log.some((e) => e.type === 'audio.cancelled')", 10)
    wait_until(page, "demo.player.stats.lastCancel !== null", 5)
    # let the audio clock run on: nothing audible may follow the stop.  Both
    # counts are the worklet's, on its own audio clock: the cancel is applied
    # between two render quanta, the cancelled context's buffered audio is
    # dropped and its frames still in flight are discarded, so not one
    # audible sample is rendered after it (no allowance for delivery time)
    clock_at_cancel = demo.stats()["lastCancel"]["clock"]
    wait_until(page, f"demo.player.stats.clock >= {clock_at_cancel + rate}", 10)
    stats = demo.stats()
    after_stop = stats["nonSilent"] - stats["lastCancel"]["nonSilent"]
    assert after_stop == 0, f"{after_stop / rate * 1000:.1f} ms audible after stop"
    cancelled = page.evaluate("demo.log.filter(e => e.type === 'audio.cancelled')")
    assert cancelled
    assert page.text_content("#utterances tbody tr .status") is not None
    assert demo.console_errors == []


def test_tiny_lead_and_withheld_reports_show_underruns(piper_server: Any, open_demo: Any) -> None:
    demo = open_demo(piper_server.http, "?max_lead_ms=100")
    page = demo.page
    assert page.evaluate("demo.client.config.max_lead_ms") == 100
    page.evaluate("demo.player.withholdReports = true")
    page.click("#paragraph")
    # the server stops within 100 ms of audio; the buffer runs dry mid-sentence
    wait_until(page, "demo.player.stats && demo.player.stats.underruns > 0", 30)
    page.evaluate("demo.player.withholdReports = false")
    wait_until(page, "Number(document.querySelector('#underruns').textContent) > 0", 5)
    page.click("#stop")
    wait_until(page, "demo.log.some((e) => e.type === 'audio.cancelled')", 10)
    assert demo.console_errors == []


def test_server_errors_are_shown_readably(piper_server: Any, open_demo: Any) -> None:
    demo = open_demo(piper_server.http, "?voice=nobody")
    page = demo.page
    wait_until(page, "document.querySelector('#errors').textContent.includes('unknown_voice')", 10)
    text = page.text_content("#errors") or ""
    assert "joe" in text, "the message lists the available voices"
    # an unknown voice is not fatal (protocol 1.1.0): the page stays connected
    # with the default voice
    assert "the connection was closed" not in text
    assert page.text_content("#status") == "open"


def test_a_polite_close_plays_everything_flushed(piper_server: Any, open_demo: Any) -> None:
    """Protocol 2.0.0: ``close({finish: true})`` right after ``done()``: the
    server speaks the whole utterance (the player's ``ack`` reports still go
    out while closing), closes with 1000, and the player plays out what it
    had queued instead of dropping it at the close."""
    demo = open_demo(piper_server.http)
    page = demo.page
    rate = page.evaluate("demo.player.sampleRate")
    page.evaluate(
        """() => {
        demo.closes = [];
        demo.done = [];
        demo.client.on("close", (d) => demo.closes.push(d));
        demo.client.on("session.done", (m) => demo.done.push(m));
        demo.renderedAtStart = demo.player.stats ? demo.player.stats.rendered : 0;
        demo.client.sendText("The keeper climbed the stairs. The lamp turned all night.");
        demo.client.done();
        demo.closing = demo.client.close({ finish: true });
    }"""
    )
    wait_until(page, "demo.closes.length > 0", 60)
    close = page.evaluate("demo.closes[0]")
    assert (close["code"], close["finished"], close["willReconnect"]) == (1000, True, False)
    (done,) = page.evaluate("demo.done")
    assert done["cancelled"] is False and not demo.events("audio.cancelled")
    expected = done["metrics"]["audio_ms"] / 1000 * rate
    # played to the end after the close (20 ms of leeway for the last quantum)
    wait_until(
        page, f"demo.player.stats.rendered - demo.renderedAtStart >= {expected - rate * 0.02}", 30
    )
    assert page.evaluate("demo.client.state") == "closed"
    assert demo.console_errors == []
