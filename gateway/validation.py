"""The one validator of what a client asks to be spoken with, shared by the
WebSocket ``session.config`` (``gateway.session_config``) and the HTTP
speech API (``gateway.routes.speech``).

Bounds come from the protocol types (``protocol.Speed``,
``protocol.SampleRate``), so the WebSocket decoder and the HTTP checks can
never disagree; voices and languages come from the engine's ``VoiceInfo``.
Each check raises ``GatewayError`` with the field as ``param``; the same
mistake gets the same code and message on both paths.  Resolving a voice
*name* (aliases, uploaded voices) is ``gateway.voices.find_speakable_voice``.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from gateway import protocol
from gateway.engines.base import VoiceInfo
from gateway.errors import ErrorCode, GatewayError

#: model names that mean "the engine the server runs" (OpenAI's and ours)
MODEL_ALIASES = frozenset({"tts-1", "tts-1-hd", "gpt-4o-mini-tts"})


def _bounds(annotated: Any) -> tuple[float, float]:
    info = msgspec.inspect.type_info(annotated)
    low, high = getattr(info, "ge", None), getattr(info, "le", None)
    assert low is not None and high is not None, annotated
    return low, high


SPEED_MIN, SPEED_MAX = _bounds(protocol.Speed)
_RATE_MIN, _RATE_MAX = _bounds(protocol.SampleRate)
SAMPLE_RATE_MIN, SAMPLE_RATE_MAX = int(_RATE_MIN), int(_RATE_MAX)


def _invalid(message: str, param: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_CONFIG, message, param=param)


def check_model(model: str, engine_name: str, model_names: Sequence[str] = ()) -> None:
    """``model`` must name this server's engine, one of its aliases, or a
    model the engine serves (``Engine.model_names``: an upstream's model)."""
    accepted = MODEL_ALIASES | {engine_name, *model_names}
    if model not in accepted:
        known = ", ".join(sorted(accepted))
        raise _invalid(
            f"unknown model {model!r}; this server runs {engine_name!r} (also: {known})", "model"
        )


def check_speed(speed: float) -> float:
    if not SPEED_MIN <= speed <= SPEED_MAX:
        raise _invalid(f"speed must be {SPEED_MIN} to {SPEED_MAX}, got {speed}", "speed")
    return speed


def check_sample_rate(rate: int) -> int:
    if not SAMPLE_RATE_MIN <= rate <= SAMPLE_RATE_MAX:
        raise _invalid(
            f"sample_rate must be {SAMPLE_RATE_MIN} to {SAMPLE_RATE_MAX} Hz, got {rate}",
            "sample_rate",
        )
    return rate


def language_matches(requested: str, voice: VoiceInfo) -> bool:
    """``requested`` names the voice's language (any spelling it lists) or is ``auto``."""
    wanted = requested.strip().casefold().replace("_", "-")
    if wanted == "auto":
        return True
    names = (voice.language, voice.language_name, *voice.language_aliases)
    return any(wanted == n.casefold().replace("_", "-") for n in names)


def check_language(requested: str, voice: VoiceInfo) -> str:
    """The voice's language tag, if ``requested`` is it (or ``auto``)."""
    if not language_matches(requested, voice):
        raise GatewayError(
            ErrorCode.UNSUPPORTED_OPTION,
            f"language: voice {voice.name!r} speaks {voice.language} ({voice.language_name}),"
            f' not {requested!r}; use "Auto" or pick another voice',
            param="language",
        )
    return voice.language


#: the longest style prompt accepted (characters); a bound on every input
MAX_INSTRUCTIONS_CHARS = 2000


def check_instructions(instructions: str | None, engine_name: str, honoured: bool) -> str | None:
    """A style prompt (``instructions``) for an engine that declares it can
    follow one (``Capabilities.instructions``, e.g. an upstream told so):
    returned stripped, or None when empty.  Any other engine takes only an
    empty one."""
    if instructions is None or not instructions.strip():
        return None
    if not honoured:
        raise GatewayError(
            ErrorCode.UNSUPPORTED_OPTION,
            f"`instructions` cannot be honoured by the {engine_name!r} engine (it has no"
            " style prompt); leave it empty",
            param="instructions",
        )
    if len(instructions) > MAX_INSTRUCTIONS_CHARS:
        raise GatewayError(
            ErrorCode.INVALID_CONFIG,
            f"`instructions` has {len(instructions)} characters; the limit is"
            f" {MAX_INSTRUCTIONS_CHARS}",
            param="instructions",
        )
    return instructions.strip()
