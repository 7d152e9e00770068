"""The segmentation policy on a real server: an LLM-paced utterance never
leaves the listener waiting for the next segment.

Asserted on the test client's audio clock, from the events the server sent,
not with wall-clock thresholds: a player starts at the first frame and plays
every frame as it arrives (resuming at once after a gap); each ``audio.start``
after the first (the server committing the next segment to the stream) must
arrive while that player still has audio.  Before the policy, a short first
clause ("Sure,") ran out while the server waited for the long sentence after
it to end.
"""

from __future__ import annotations

import asyncio
import time

from gateway.bench.measure import tokenize
from gateway.client import AudioFrame, Client, frame_ms
from gateway.protocol import AudioStart, Error, SessionConfig, SessionDone
from gateway.text.segmenter import end_kind
from tests.conftest import RunningServer

REPLY = (
    "Sure, I can help you plan a weekend trip to the mountains near the lake where the"
    " trails stay quiet in autumn and the views reach across three valleys before the snow"
    " comes. Pack warm layers and water."
)
TOKENS_PER_S = 20.0


async def test_llm_paced_utterance_commits_each_segment_before_the_listener_runs_dry(
    piper_server: RunningServer,
) -> None:
    config = SessionConfig(response_format="pcm", stream_audio=True, frame_ms=20)
    client = await Client.connect(piper_server.ws_url, config)
    try:
        while client.queued:  # session.updated
            await client.next_event(1.0)

        async def llm() -> None:
            for token in tokenize(REPLY):
                await client.send_text(token)
                await asyncio.sleep(1 / TOKENS_PER_S)
            await client.done()

        sender = asyncio.create_task(llm())
        runs_dry: float | None = None  # when the player's audio runs out
        starts: list[tuple[str, float, float | None]] = []  # text, arrival, runs_dry then
        async with asyncio.timeout(90):
            while True:
                event = await client.next_event()
                if isinstance(event, AudioStart):
                    # taken off the queue now: no earlier than its arrival
                    starts.append((event.sentence_text, time.perf_counter(), runs_dry))
                elif isinstance(event, AudioFrame):
                    at = event.received_at
                    runs_dry = max(runs_dry if runs_dry is not None else at, at)
                    runs_dry += frame_ms(event) / 1000
                elif isinstance(event, SessionDone):
                    break
                else:
                    assert not isinstance(event, Error), event
        await sender
    finally:
        await client.aclose()

    texts = [text for text, _, _ in starts]
    assert "".join(texts).replace(" ", "") == REPLY.replace(" ", "")
    assert texts[0] == "Sure,"
    # the long sentence was cut where the buffer needed it, not at its end
    assert any(end_kind(text) is None for text in texts[1:-1]), texts
    for text, arrived, dry_at in starts[1:]:
        assert dry_at is not None
        assert arrived <= dry_at, (
            f"segment {text!r} started {1000 * (arrived - dry_at):.0f} ms after the"
            f" listener ran out of audio; segments: {texts}"
        )
