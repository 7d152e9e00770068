"""Round 19: the flow's CPU for a segment in main's windows (every segment's
first window only what its first chunk needs) against the fewest windows
of 256 frames (``plan_segment_flow`` for later segments, on branch
``xp-flow-whole``; tried, not kept), one thread, process CPU, the bundled
voice, median of 30 after 3 warm runs.

    .venv/bin/python bench/results/round19/flow/flowbench.py
"""

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable

from gateway.engines.piper import PiperEngine
from gateway.engines.piper.acoustic import MAX_FLOW_WINDOW, plan_flow_windows
from gateway.engines.piper.settings import PiperSettings
from gateway.settings import Settings

TEXTS = [
    "Sure.",
    "I checked the forecast for you.",
    "It will be cloudy in the morning, with a chance of rain after lunch.",
    "Let me look that up, and I will get back to you in a moment with the details you asked for.",
]


def cpu_ms(fn: Callable[[], object]) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(30):
        t = time.process_time()
        fn()
        times.append((time.process_time() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    settings = Settings(
        data_dir=tempfile.mkdtemp(),
        piper=PiperSettings(
            deterministic=True, device="cpu", acoustic_threads=1, vocoder_threads=1
        ),
    )
    engine = PiperEngine(settings)
    asyncio.run(engine.start())
    voice = engine.loaded_voice("joe")
    for text in TEXTS:
        ids = voice.phonemizer.phonemes_to_ids(voice.phonemize(text))
        encoded = voice.acoustic.encode(ids, voice.scales(1.0, deterministic=True))
        frames = encoded.frames
        opening = plan_flow_windows(frames, 27)  # main's plan for every segment
        later = plan_flow_windows(frames, MAX_FLOW_WINDOW, second=0)  # xp-flow-whole's
        ms = {
            name: cpu_ms(lambda p=plan, e=encoded: [voice.acoustic.flow_window(e, w) for w in p])
            for name, plan in (("opening", opening), ("later", later))
        }
        print(
            f"{frames:4d} frames: {len(opening)} windows {ms['opening']:.1f} ms, "
            f"{len(later)} windows {ms['later']:.1f} ms"
        )
    asyncio.run(engine.aclose())


if __name__ == "__main__":
    main()
