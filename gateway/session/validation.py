"""The one validator of what a client asks to be spoken with, shared by the
WebSocket ``session.config`` (``gateway.session.config``) and the HTTP
speech API (``gateway.http.plan``).

Bounds come from the protocol types (``protocol.Speed``,
``protocol.SampleRate``), so the WebSocket decoder and the HTTP checks can
never disagree; voices and languages come from the engine's ``VoiceInfo``.
Each check raises ``GatewayError`` with the field as ``param``; the same
mistake gets the same code and message on both paths.  Resolving a voice
*name* (aliases, uploaded voices) is ``gateway.voices.catalog.find_speakable_voice``.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from gateway import protocol
from gateway.engines.base import CLONING_OPTIONS, VoiceInfo
from gateway.errors import ErrorCode, GatewayError
from gateway.text.frontend.lexicon import MAX_KEY_CHARS, MAX_SPOKEN_CHARS
from gateway.text.segmenter import is_speakable

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


def invalid_config(message: str, param: str) -> GatewayError:
    """A configuration field's mistake (``voice``, ``speed``, ``stream`` ...)."""
    return GatewayError(ErrorCode.INVALID_CONFIG, message, param=param)


def invalid_message(message: str, param: str) -> GatewayError:
    """A mistake in the message itself: its text, its shape (never a
    configuration field)."""
    return GatewayError(ErrorCode.INVALID_MESSAGE, message, param=param)


def check_input_text(text: str, max_chars: int, param: str = "input") -> str:
    """A whole text to be spoken (the HTTP API's ``input``): a mistake in it
    is ``invalid_message`` (``text_too_long`` over ``max_chars``), as the
    same mistake in the WebSocket's ``input.text`` is."""
    if not text.strip():
        raise invalid_message(f"`{param}` is empty", param)
    protocol.check_no_nul(text, f"`{param}`", f"$.{param}", param)
    if len(text) > max_chars:
        raise GatewayError(
            ErrorCode.TEXT_TOO_LONG,
            f"`{param}` has {len(text)} characters; the limit is {max_chars} characters",
            param=param,
        )
    if not is_speakable(text):
        raise invalid_message(f"`{param}` has nothing speakable (no letters or digits)", param)
    return text


def check_model(model: str, engine_name: str, model_names: Sequence[str] = ()) -> None:
    """``model`` must name this server's engine, one of its aliases, or a
    model the engine serves (``Engine.model_names``: an upstream's model)."""
    accepted = MODEL_ALIASES | {engine_name, *model_names}
    if model not in accepted:
        known = ", ".join(sorted(accepted))
        raise invalid_config(
            f"unknown model {model!r}; this server runs {engine_name!r} (also: {known})", "model"
        )


def check_speed(speed: float) -> float:
    if not SPEED_MIN <= speed <= SPEED_MAX:
        raise invalid_config(f"speed must be {SPEED_MIN} to {SPEED_MAX}, got {speed}", "speed")
    return speed


def check_speed_honoured(speed: float, engine_name: str, honoured: bool) -> float:
    """``speed`` other than 1.0 for an engine that declares it can change
    the pace (``Capabilities.speed``); any other engine takes only 1.0."""
    if speed != 1.0 and not honoured:
        raise GatewayError(
            ErrorCode.UNSUPPORTED_OPTION,
            f"`speed` {speed} cannot be honoured by the {engine_name!r} engine (its servers"
            " do not change the pace of a streamed response); send 1.0",
            param="speed",
        )
    return speed


def check_sample_rate(rate: int) -> int:
    if not SAMPLE_RATE_MIN <= rate <= SAMPLE_RATE_MAX:
        raise invalid_config(
            f"sample_rate must be {SAMPLE_RATE_MIN} to {SAMPLE_RATE_MAX} Hz, got {rate}",
            "sample_rate",
        )
    return rate


def language_matches(requested: str, voice: VoiceInfo) -> bool:
    """``requested`` names the voice's language (any spelling it lists), its
    primary language alone (``en`` for an ``en-US`` voice), or is ``auto``."""
    wanted = requested.strip().casefold().replace("_", "-")
    if wanted == "auto":
        return True
    names = [
        n.casefold().replace("_", "-")
        for n in (voice.language, voice.language_name, *voice.language_aliases)
    ]
    primary = names[0].split("-")[0]
    return wanted in names or wanted == primary


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


#: vllm-omni's extension fields and the values every engine takes silently
VLLM_DEFAULTS: dict[str, frozenset[object]] = {
    "task_type": frozenset({"CustomVoice"}),
    "ref_audio": frozenset({""}),
    "ref_text": frozenset({""}),
    "x_vector_only_mode": frozenset({False}),
    "non_streaming_mode": frozenset({False}),
    "word_timestamps": frozenset({False}),
}
#: vllm-omni's fields whose every (non-negative) value is harmless here
VLLM_ANY = ("max_new_tokens", "initial_codec_chunk_frames")
#: the longest ``ref_text`` accepted (characters)
MAX_REF_TEXT_CHARS = 2000


def check_vllm_fields(fields: Mapping[str, Any], cloning: bool) -> dict[str, object]:
    """vllm-omni's extension fields, alike for ``session.config`` and HTTP.

    ``fields`` holds the ones a client gave (not null).  At their defaults they
    are accepted silently.  An engine that declares ``cloning`` (an upstream
    in front of a voice-cloning model) receives the voice-clone fields
    (``CLONING_OPTIONS``): they are returned as ``StreamRequest.options``,
    a default value as a removal (``None``).  Anything else is
    ``unsupported_option``.  ``ref_audio`` is passed through as given (a URL
    or a base64 data URL, which the upstream fetches or decodes); its size is
    bounded by the message and body limits."""
    options: dict[str, object] = {}
    for name, accepted in VLLM_DEFAULTS.items():
        if name not in fields:
            continue
        value = fields[name]
        if cloning and name in CLONING_OPTIONS:
            if name == "ref_text" and len(str(value)) > MAX_REF_TEXT_CHARS:
                raise GatewayError(
                    ErrorCode.INVALID_CONFIG,
                    f"`ref_text` has {len(str(value))} characters; the limit is"
                    f" {MAX_REF_TEXT_CHARS}",
                    param=name,
                )
            options[name] = None if value in accepted else value
            continue
        if value in accepted:
            continue
        raise GatewayError(
            ErrorCode.UNSUPPORTED_OPTION,
            f"`{name}` = {_shown(value)} is not supported by this engine"
            + (
                "; use the gateway's `timestamps: true` for word timings"
                if name == "word_timestamps"
                else ""
            ),
            param=name,
        )
    if fields.get("speaker_embedding") is not None:
        raise GatewayError(
            ErrorCode.UNSUPPORTED_OPTION,
            "`speaker_embedding` is not supported by this engine",
            param="speaker_embedding",
        )
    for name in VLLM_ANY:
        value = fields.get(name)
        if value is not None and value < 0:
            raise GatewayError(ErrorCode.INVALID_CONFIG, f"`{name}` must be >= 0", param=name)
    return options


def _shown(value: object) -> str:
    """A value in an error message, cut short (``ref_audio`` may be megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- the text front-end's controls (``docs/text.md``) ------------------------------

#: entries of one ``pronunciations`` map (the longest word and text are the
#: lexicon file's: ``MAX_KEY_CHARS``, ``MAX_SPOKEN_CHARS``)
MAX_PRONUNCIATIONS = 256


def check_choice(value: str, param: str, choices: Sequence[str]) -> str:
    """``value`` must be one of ``choices`` (the HTTP body's strings; the
    WebSocket decoder already holds ``session.config`` to them)."""
    if value not in choices:
        raise invalid_config(
            f"{param} must be one of {', '.join(repr(c) for c in choices)}, not {_shown(value)}",
            param,
        )
    return value


def check_pronunciations(value: Mapping[str, str]) -> dict[str, str]:
    """A ``pronunciations`` map (a word or phrase -> the text spoken instead):
    at most ``MAX_PRONUNCIATIONS`` entries, keys and values non-empty, without
    NUL and at most ``MAX_KEY_CHARS``/``MAX_SPOKEN_CHARS`` characters; keys
    are stripped."""
    param = "pronunciations"
    if len(value) > MAX_PRONUNCIATIONS:
        raise invalid_config(
            f"`pronunciations` has {len(value)} entries; the limit is {MAX_PRONUNCIATIONS}", param
        )
    checked: dict[str, str] = {}
    for key, spoken in value.items():
        word = key.strip()
        if not word or not spoken.strip():
            raise invalid_config(
                f"`pronunciations` entry {_shown(key)}: the word and its text must not be empty",
                param,
            )
        if len(word) > MAX_KEY_CHARS or len(spoken) > MAX_SPOKEN_CHARS:
            raise invalid_config(
                f"`pronunciations` entry {_shown(key)}: at most {MAX_KEY_CHARS} characters"
                f" for the word and {MAX_SPOKEN_CHARS} for its text",
                param,
            )
        if "\x00" in word or "\x00" in spoken:
            raise invalid_config(
                f"`pronunciations` entry {_shown(key)} contains a NUL character", param
            )
        checked[word] = spoken.strip()
    return checked
