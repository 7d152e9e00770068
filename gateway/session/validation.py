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

import math
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
            f"`speed` {speed} cannot be honoured by the {engine_name!r} engine (it does"
            " not change the pace of its speech); send 1.0 or leave `speed` out",
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


# --- vllm-omni 0.30's fields (docs/protocol.md, "vllm-omni 0.30, field by field") ---

#: vllm-omni 0.30's fields that only tune a model the gateway does not run
#: (Qwen3-TTS's token budget, its first codec chunk, its prompt construction):
#: any value of the right type is accepted and ignored
TUNING_FIELDS = ("max_new_tokens", "initial_codec_chunk_frames", "non_streaming_mode")
#: voice-clone fields and the values that mean "no clone", which every engine
#: takes silently; an engine declaring ``cloning`` receives the others
#: (``CLONING_OPTIONS``)
CLONE_DEFAULTS: dict[str, tuple[object, ...]] = {
    "task_type": ("CustomVoice",),
    "ref_audio": ("", []),
    "ref_text": ("",),
    "x_vector_only_mode": (False,),
    "speaker_embedding": ([],),
    "ref_audio_2": ("",),
}
assert tuple(CLONE_DEFAULTS) == CLONING_OPTIONS, "the engine receives the clone fields checked here"
#: vllm-omni 0.30's fields that would change the output and that no engine
#: here produces (sound effects, a model's own extra arguments): accepted
#: empty (``""``, ``{}``), else ``unsupported_option`` naming the field
UNSUPPORTED_FIELDS: dict[str, tuple[object, ...]] = {
    "ambient_sound": ("",),
    "duration_seconds": (),
    "extra_params": ({},),
}
#: every vllm-omni field ``check_vllm_fields`` reads (the rest of 0.30's
#: fields are the gateway's own: voice, speed, language, ...)
VLLM_FIELDS: tuple[str, ...] = (*CLONE_DEFAULTS, *TUNING_FIELDS, *UNSUPPORTED_FIELDS)
#: the longest ``ref_text`` accepted (characters)
MAX_REF_TEXT_CHARS = 2000
#: the longest ``speaker_embedding`` (numbers), as vllm-omni 0.30 caps it
MAX_EMBEDDING_VALUES = 8192


def check_vllm_fields(fields: Mapping[str, Any], cloning: bool) -> dict[str, object]:
    """vllm-omni's extension fields, alike for ``session.config`` and HTTP.

    ``fields`` holds the ones a client gave (not null).  The tuning fields
    are accepted whatever their value (never negative).  A voice-clone field
    at its "no clone" value is accepted by every engine; an engine that
    declares ``cloning`` (an upstream in front of a voice-cloning model)
    receives the others as ``StreamRequest.options`` (a "no clone" value is
    returned as a removal, ``None``); any other engine refuses them with
    ``unsupported_option``, as it refuses the fields no engine here honours.
    ``ref_audio`` (a URL, a base64 data URL, or a list of them) is passed
    through as given; its size is bounded by the message and body limits."""
    options: dict[str, object] = {}
    for name, accepted in CLONE_DEFAULTS.items():
        if name not in fields:
            continue
        value = fields[name]
        if name == "ref_text" and len(str(value)) > MAX_REF_TEXT_CHARS:
            raise invalid_config(
                f"`ref_text` has {len(str(value))} characters; the limit is {MAX_REF_TEXT_CHARS}",
                name,
            )
        if name == "speaker_embedding":
            _check_embedding(value)
        if cloning:
            options[name] = None if value in accepted else value
        elif value not in accepted:
            raise _unsupported(name, value)
    for name, accepted in UNSUPPORTED_FIELDS.items():
        if name in fields and fields[name] not in accepted:
            raise _unsupported(name, fields[name])
    for name in TUNING_FIELDS:
        value = fields.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise invalid_config(f"`{name}` must be >= 0", name)
    return options


def _unsupported(name: str, value: object) -> GatewayError:
    return GatewayError(
        ErrorCode.UNSUPPORTED_OPTION,
        f"`{name}` = {_shown(value)} is not supported by this engine; it would change the"
        " audio, so leave it out",
        param=name,
    )


def _check_embedding(value: object) -> None:
    """A flat list of finite numbers, or a list of such lists (vllm-omni's
    two forms), at most ``MAX_EMBEDDING_VALUES`` long."""
    vectors = value if isinstance(value, list) and value and isinstance(value[0], list) else [value]
    for vector in vectors:
        ok = isinstance(vector, list) and all(
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
            for x in vector
        )
        if not ok:
            raise invalid_config(
                "`speaker_embedding` must be a list of finite numbers or a list of such lists",
                "speaker_embedding",
            )
        if len(vector) > MAX_EMBEDDING_VALUES:  # type: ignore[arg-type]
            raise invalid_config(
                f"`speaker_embedding` has more than {MAX_EMBEDDING_VALUES} values",
                "speaker_embedding",
            )


def check_seed(seed: int | None, engine_name: str, honoured: bool) -> int | None:
    """``seed`` (vllm-omni 0.30: an int64) for an engine that declares
    ``Capabilities.seed``; another engine refuses it, as its audio would
    not be reproducible as asked."""
    if seed is None:
        return None
    if not -(2**63) <= seed < 2**63:
        raise invalid_config(f"`seed` must be a 64-bit integer, got {seed}", "seed")
    if not honoured:
        raise GatewayError(
            ErrorCode.UNSUPPORTED_OPTION,
            f"`seed` cannot be honoured by the {engine_name!r} engine (its audio cannot be made"
            " reproducible by a seed); leave it out",
            param="seed",
        )
    return seed


def references_to_ref_audio(body: dict[str, Any]) -> dict[str, Any]:
    """vllm-omni 0.30's ``references`` (Higgs Audio's cookbook form,
    ``[{"audio_path": ..., "text": ...}]``, one reference) read into
    ``ref_audio`` and ``ref_text``, with 0.30's rules; a new dict without it."""
    refs = body.get("references")
    if refs is None:
        return {k: v for k, v in body.items() if k != "references"}
    param = "references"
    if not isinstance(refs, list) or not refs:
        raise invalid_config(
            "`references` must be a non-empty array of {audio_path, text} objects", param
        )
    if len(refs) > 1:
        raise invalid_config(
            "`references` takes a single reference; several (multi-shot cloning) are not supported",
            param,
        )
    first = refs[0]
    audio_path = first.get("audio_path") if isinstance(first, dict) else None
    if not isinstance(audio_path, str) or not audio_path:
        raise invalid_config("`references[0].audio_path` is required: a URL or a data: URI", param)
    out = {k: v for k, v in body.items() if k != "references"}
    if out.get("ref_audio") and out["ref_audio"] != audio_path:
        raise invalid_config("`references` and `ref_audio` are mutually exclusive", param)
    out["ref_audio"] = audio_path
    text = first.get("text")  # type: ignore[union-attr]  # a dict, checked above
    if isinstance(text, str) and text.strip():
        if out.get("ref_text") and out["ref_text"] != text:
            raise invalid_config(
                "`references[0].text` and `ref_text` differ; send one of them", param
            )
        out["ref_text"] = text
    return out


def unknown_fields(keys: Sequence[str], known: frozenset[str] | set[str]) -> list[str]:
    """The keys of a speech request that name no field of this gateway or of
    vllm-omni: ignored, and named in a warning (``ignored_fields_message``)."""
    return [key for key in keys if key not in known]


#: the most field names one warning lists (a body may carry thousands of keys)
MAX_NAMED_FIELDS = 20


#: the longest field name a warning repeats (characters)
MAX_NAME_CHARS = 64


def named_fields(names: Sequence[str]) -> list[str]:
    """The ignored fields a warning names: the first ``MAX_NAMED_FIELDS``,
    each cut to ``MAX_NAME_CHARS`` (a client's keys are not echoed unbounded)."""
    return [name[:MAX_NAME_CHARS] for name in names[:MAX_NAMED_FIELDS]]


def ignored_fields_message(names: Sequence[str]) -> str:
    """The warning for ``names`` (WebSocket ``warning``, HTTP ``X-Ignored-Fields``)."""
    shown = ", ".join(f"`{n}`" for n in named_fields(names))
    more = f" and {len(names) - MAX_NAMED_FIELDS} more" if len(names) > MAX_NAMED_FIELDS else ""
    return f"unknown fields ignored: {shown}{more} (check their spelling)"


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
