"""Drops at random points of LLM-paced replies, resumed, on a real server
through a real link (``gateway.bench.link``): the invariants of
``bench/resume_drops.py`` (issue 30), without its timings.

Each reply is one session sending its text as tokens; the link is cut at a
seeded random byte of what the server sends (both sides reset, or only the
client's with the server left unaware, which the resume then takes over),
so what the server wrote past that byte is lost on the way; the client
resumes at once with its counts.  In every resumed session the sequence
numbers continue from the client's count, no sample offset repeats or
skips, the samples are what ``audio.done`` reports, ``session.done`` ends
it, and the joined audio is an uninterrupted run's sample for sample
(``seed``, ``split_granularity: "sentence"``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from gateway.bench import resume
from gateway.bench.drivers import Pacing
from gateway.bench.link import LinkProxy
from tests.conftest import RunningServer

PATH = "/v1/audio/speech/stream"
#: (reply, cuts, the server's side reset) per session: 5 drops in 4 sessions;
#: short replies of two sentences keep the test fast (the benchmark speaks
#: ``gateway.bench.corpus``'s paragraphs)
SESSIONS = [
    ("Sure, I can help with that. The train leaves at ten past nine.", 1, True),
    ("Good question. Water it once a week, and check the soil first.", 1, False),
    ("Here is what I found. The library opens at eight on weekdays.", 2, True),
    ("Of course. Your order left the warehouse this morning.", 1, False),
]


async def test_dropped_replies_resume_without_losing_a_sample(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(resume_window_s=30)
    rng = random.Random(30)
    session_config = resume.config(seed=7, flow_control="none")
    pacing = Pacing(streamed=True, token_rate=40.0)
    replayed = 0
    port = int(server.url.rsplit(":", 1)[1])
    async with LinkProxy(port, delay_s=0.01, jitter_s=0.004, seed=30) as link:
        for text, cuts, server_side in SESSIONS:
            reference = await resume.reference(server.ws_url, text, session_config)
            audio = len(resume.pcm(reference))
            # the link is cut at a byte: the first connection within the
            # reply's audio (past session.created and session.updated),
            # a resumed one soon after its session.resumed
            limits = [rng.randrange(4000, audio * 9 // 10)]
            limits += [rng.randrange(3000, 12000) for _ in range(cuts - 1)]
            link.plan_cuts(limits, server_side)
            run = await resume.speak_with_drops(
                link.url("ws", PATH), text, session_config, [], lambda: None, pacing, rng, 60
            )
            context = (text[:30], limits, server_side, run.trace())
            assert run.error is None, context
            assert len(run.legs) == 1 + cuts, context  # cut, and resumed
            checks = resume.check(run, reference)
            assert checks.failed() == [], (checks, context)
            assert checks.audio_equals_reference is True
            replayed += sum(leg.resumed["replayed_messages"] for leg in run.legs if leg.resumed)
    # the cuts lost messages in flight, which the resumes sent again
    assert replayed > 0
    async with asyncio.timeout(10):
        while server.state.sessions:  # every session ended with its client's close
            await asyncio.sleep(0.01)
    assert server.state.resumes.suspended == 0
