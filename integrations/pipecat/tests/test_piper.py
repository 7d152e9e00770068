"""One turn with the gateway's real engine (Piper): speech at the pipeline's
rate, resampled by the gateway from the voice's 22050 Hz, with word
timestamps from Piper's own alignment."""

from __future__ import annotations

from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame, TTSStoppedFrame, TTSTextFrame
from pipecat.transcriptions.language import Language
from voice_gateway_wire.testing import Gateway

from tests.test_pipeline import PIPELINE_RATE, pipeline
from voice_gateway_pipecat import GatewayTTSSettings


async def test_piper_turn(piper_gateway: Gateway) -> None:
    # Pipecat's usual Language.EN: Piper's voice answers only to en-US, en_US
    # or English, so the service sends the voice's own tag
    settings = GatewayTTSSettings(language=Language.EN)
    async with pipeline(piper_gateway, settings=settings) as h:
        assert h.tts.server_info["engine"] == "piper"
        assert h.tts.effective_config["language"] == "en-US"
        native = h.tts.server_info["voices"][0]["sample_rate"]
        assert native != PIPELINE_RATE  # the gateway resamples
        await h.send(TTSSpeakFrame("The quick brown fox jumps over the lazy dog."))
        await h.down.wait_for(lambda: bool(h.down.of(TTSStoppedFrame)))
        audio = h.down.of(TTSAudioRawFrame)
        assert audio and all(f.sample_rate == PIPELINE_RATE for f in audio)
        seconds = sum(len(f.audio) for f in audio) / 2 / PIPELINE_RATE
        assert 1.0 < seconds < 6.0  # nine words of real speech
        words = [f.text.strip() for f in h.down.of(TTSTextFrame)]
        assert " ".join(words).lower().startswith("the quick brown fox")
