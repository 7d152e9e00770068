"""How many streams an engine speaks in real time on this machine, measured.

What this module is for: automatic admission (``gateway.flow.capacity``)
starts from a measurement rather than a guess.  ``realtime_streams`` runs
``PROBE_STREAMS`` utterances at once through the engine's own interface (its
scheduler and thread plan included), each speaking sentences of the
calibration text (``gateway/data/calibration.txt``) as fast as the engine
goes, and returns the seconds of audio produced per second of wall time.
It takes about 2.5 s on the 2-core reference machine (7.4 real-time streams
there).

What it must not do: run on a server that already serves (the app runs it in
the lifespan, before ``/readyz`` says ready), or block the event loop (the
engine computes on its own threads).
"""

from __future__ import annotations

import asyncio
import re
import time

from gateway.engines.base import AudioChunk, Engine, SegmentRequest, StreamRequest
from gateway.ops.resources import CALIBRATION_TEXT

#: utterances at once: enough to keep both of a 2-core machine's workers busy
PROBE_STREAMS = 2
#: sentences each utterance speaks
PROBE_SENTENCES = 2


def probe_sentences() -> list[str]:
    text = CALIBRATION_TEXT.read_text(encoding="utf-8")
    return [s for s in re.split(r"(?<=[.!?:])\s+", text.strip()) if s]


async def realtime_streams(engine: Engine) -> float:
    """Seconds of audio the engine produced per second, ``PROBE_STREAMS`` at once."""
    voice = engine.default_voice()
    sentences = probe_sentences()

    async def speak(first: int) -> float:
        stream = engine.open_stream(
            StreamRequest(voice=voice.name, first_audio_priority=False, label="capacity probe")
        )
        samples = 0
        try:
            for n in range(PROBE_SENTENCES):
                text = sentences[(first + n) % len(sentences)]
                job = stream.submit(SegmentRequest(text=text, deadline=time.monotonic()))
                async for event in job:
                    if isinstance(event, AudioChunk):
                        samples += len(event.samples)
        finally:
            stream.close()
        return samples / voice.sample_rate

    started = time.monotonic()
    spoken = await asyncio.gather(*(speak(i * PROBE_SENTENCES) for i in range(PROBE_STREAMS)))
    return sum(spoken) / max(1e-6, time.monotonic() - started)
