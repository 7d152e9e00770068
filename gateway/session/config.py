"""Applying a ``session.config`` message: pure validation and merging.

A config is applied as a whole or not at all: ``apply_config`` either returns
a complete new ``EffectiveConfig`` or raises ``GatewayError`` and the session
keeps the one it had.  Fields a message leaves out (or sets to null) keep
their current value; the first config starts from the defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
from msgspec import UNSET

from gateway.audio.framing import frame_start
from gateway.engines.base import Engine, VoiceInfo, voice_named
from gateway.errors import ErrorCode, GatewayError
from gateway.protocol import EffectiveConfig, SessionConfig
from gateway.session.validation import (
    VLLM_FIELDS,
    check_instructions,
    check_language,
    check_model,
    check_pronunciations,
    check_sample_rate,
    check_seed,
    check_speed,
    check_speed_honoured,
    check_vllm_fields,
    invalid_config,
)


def frame_samples(sample_rate: int, frame_ms: int) -> int:
    """Nominal samples in the first frame (the grid's own rounding)."""
    return frame_start(1, sample_rate, frame_ms)


def default_config(voice: VoiceInfo, engine_name: str) -> EffectiveConfig:
    return EffectiveConfig(
        voice=voice.name,
        language=voice.language,
        speed=1.0,
        response_format="wav",
        stream_audio=False,
        encoding="pcm_s16le",
        sample_rate=voice.sample_rate,
        frame_ms=20,
        frame_samples=frame_samples(voice.sample_rate, 20),
        split_granularity="auto",
        flow_control="none",
        max_lead_ms=1000,
        timestamps=False,
        framing="raw",
        model=engine_name,
    )


def _find_voice(name: str, voices: Sequence[VoiceInfo]) -> VoiceInfo:
    """A canonical voice name (``VoiceDesk`` resolved aliases and uploads
    before the config got here), or ``unknown_voice``."""
    voice = voice_named(voices, name)
    if voice is not None:
        return voice
    available = ", ".join(v.name for v in voices)
    raise GatewayError(
        ErrorCode.UNKNOWN_VOICE,
        f"unknown voice {name!r}; available voices: {available}",
        param="voice",
    )


def vllm_fields(msg: SessionConfig) -> dict[str, Any]:
    """The vllm-omni extension fields ``msg`` gives (not left out, not null)."""
    return {
        name: getattr(msg, name)
        for name in VLLM_FIELDS
        if hasattr(msg, name) and _given(getattr(msg, name))
    }


def clone_options(
    current: Mapping[str, object], msg: SessionConfig, cloning: bool
) -> dict[str, object]:
    """The voice-clone options in force after ``msg`` (``StreamRequest.options``
    for an engine that declares ``cloning``): a field given replaces, a
    default value (``""``, ``false``, ``"CustomVoice"``) removes, one left
    out is kept.  Raises ``GatewayError`` like ``apply_config``."""
    merged = dict(current)
    for name, value in check_vllm_fields(vllm_fields(msg), cloning).items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    return merged


def apply_for_engine(
    current: EffectiveConfig,
    options: Mapping[str, object],
    msg: SessionConfig,
    engine: Engine,
    *,
    busy: Callable[[], bool],
) -> tuple[EffectiveConfig, dict[str, object]]:
    """A session's config and voice-clone options after ``msg`` (its voice
    names resolved), checked against what ``engine`` offers; ``busy``: an
    utterance is in progress (``framing`` cannot change then), asked last.  All or
    nothing: raises ``GatewayError`` and nothing changes."""
    caps = engine.capabilities
    new = apply_config(
        current,
        msg,
        engine.voices(),
        engine.name,
        engine.model_names(),
        instructions=caps.instructions,
        cloning=caps.cloning,
        seed=caps.seed,
        alignment=caps.alignment,
        speed=caps.speed,
    )
    new_options = clone_options(options, msg, caps.cloning)
    if busy() and (new.framing != current.framing):
        raise GatewayError(
            ErrorCode.INVALID_STATE,
            "`framing` cannot change while an utterance is in progress;"
            " send it before the next utterance",
            param="framing",
        )
    return new, new_options


def _given(value: Any) -> bool:
    return value is not UNSET and value is not None


def apply_config(
    current: EffectiveConfig,
    msg: SessionConfig,
    voices: Sequence[VoiceInfo],
    engine_name: str,
    model_names: Sequence[str] = (),
    *,
    instructions: bool = False,
    cloning: bool = False,
    seed: bool = False,
    alignment: bool = False,
    speed: bool = True,
) -> EffectiveConfig:
    """Return the config in force after ``msg``, or raise ``GatewayError``.
    ``instructions``, ``cloning``, ``seed``, ``alignment``, ``speed``: the
    engine's capabilities (a style prompt, voice-clone fields, kept by
    ``clone_options``, a sampling seed, word timings, a pace other than 1.0)."""
    check_vllm_fields(vllm_fields(msg), cloning)
    if _given(msg.voice) and _given(msg.speaker):
        assert isinstance(msg.voice, str) and isinstance(msg.speaker, str)
        if msg.voice.strip().casefold() != msg.speaker.strip().casefold():
            raise GatewayError(
                ErrorCode.INVALID_CONFIG,
                f"`voice` ({msg.voice!r}) and its alias `speaker` ({msg.speaker!r}) differ;"
                " send one of them",
                param="voice",
            )
    changes: dict[str, Any] = {}
    voice_name = msg.voice if _given(msg.voice) else msg.speaker
    voice = _find_voice(current.voice, voices)
    if _given(voice_name):
        assert isinstance(voice_name, str)
        voice = _find_voice(voice_name, voices)
        if voice.name != current.voice:
            changes["voice"] = voice.name
            # a new voice brings its own language and, unless asked, its rate
            changes["language"] = voice.language
            if not _given(msg.sample_rate) and current.sample_rate == _native_rate(
                current.voice, voices
            ):
                changes["sample_rate"] = voice.sample_rate
    if _given(msg.language):
        assert isinstance(msg.language, str)
        changes["language"] = check_language(msg.language, voice)
    if isinstance(msg.instructions, str):  # "" clears it; null keeps it
        changes["instructions"] = check_instructions(msg.instructions, engine_name, instructions)
    if _given(msg.model):
        assert isinstance(msg.model, str)
        check_model(msg.model, engine_name, model_names)
    if _given(msg.seed):
        assert isinstance(msg.seed, int)
        changes["seed"] = check_seed(msg.seed, engine_name, seed)
    # the decoder already holds these to the protocol's bounds; a message
    # built in code goes through the same check
    if isinstance(msg.speed, float | int) and not isinstance(msg.speed, bool):
        check_speed(msg.speed)
        check_speed_honoured(msg.speed, engine_name, speed)
    if isinstance(msg.sample_rate, int) and not isinstance(msg.sample_rate, bool):
        check_sample_rate(msg.sample_rate)
    for name in (
        "speed",
        "response_format",
        "stream_audio",
        "encoding",
        "sample_rate",
        "frame_ms",
        "split_granularity",
        "flow_control",
        "max_lead_ms",
        "timestamps",
        "framing",
        "input_format",
        "normalize",
        "emoji",
        "debug_engine_text",
        "word_timestamps",
    ):
        value = getattr(msg, name)
        if _given(value):
            changes[name] = value
    if isinstance(msg.pronunciations, dict):  # a map given replaces; {} clears
        changes["pronunciations"] = check_pronunciations(msg.pronunciations)
    merged = msgspec.structs.replace(current, **changes)
    if merged.flow_control != "none" and not merged.stream_audio:
        raise GatewayError(
            ErrorCode.INVALID_CONFIG,
            f"flow_control {merged.flow_control!r} needs `stream_audio: true`",
            param="flow_control",
        )
    if merged.word_timestamps:
        _check_word_timestamps(merged, alignment)
    return msgspec.structs.replace(
        merged, frame_samples=frame_samples(merged.sample_rate, merged.frame_ms)
    )


def _check_word_timestamps(config: EffectiveConfig, alignment: bool) -> None:
    """vllm-omni's ``word_timestamps``: its JSON ``audio.chunk`` frames carry
    streamed PCM (as in vllm-omni 0.30) and the engine's word timings."""
    if not alignment:
        raise GatewayError(
            ErrorCode.UNSUPPORTED_OPTION,
            "`word_timestamps` needs word timings, which this engine does not give",
            param="word_timestamps",
        )
    if not (config.stream_audio and config.response_format == "pcm"):
        raise invalid_config(
            '`word_timestamps` (true) needs `stream_audio: true` and `response_format: "pcm"`'
            " (the timings ride the streamed audio.chunk events)",
            "word_timestamps",
        )
    if config.framing != "raw":
        raise invalid_config(
            "`word_timestamps` (true) sends audio as JSON audio.chunk events, which carry"
            ' their context: it takes `framing: "raw"`',
            "word_timestamps",
        )


def _native_rate(voice_name: str, voices: Sequence[VoiceInfo]) -> int:
    for voice in voices:
        if voice.name == voice_name:
            return voice.sample_rate
    return -1
