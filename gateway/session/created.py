"""What ``session.created`` and ``session.updated`` tell a client about its
session: the server's limits and the engine's voices and capabilities.
Pure functions of the settings, the engine and the config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway import protocol
from gateway.engines.base import Engine
from gateway.session.capabilities import capabilities_message
from gateway.text.frontend.lexicon import MAX_SPOKEN_CHARS

if TYPE_CHECKING:
    from gateway.settings import Settings


def session_limits(settings: Settings, engine: Engine) -> protocol.Limits:
    s = settings
    capabilities = engine.capabilities
    return protocol.Limits(
        max_message_bytes=s.max_message_bytes,
        max_input_text_bytes=s.max_input_text_bytes,
        max_utterance_chars=s.max_utterance_chars,
        max_contexts=s.max_contexts,
        max_buffered_ms=s.max_buffered_ms,
        config_timeout_s=s.config_timeout_s,
        idle_timeout_s=s.idle_timeout_s,
        stall_timeout_s=s.stall_timeout_s,
        max_utterance_engine_chars=s.engine_chars_budget,
        max_segment_chars=s.max_segment_chars,
        max_pronunciation_chars=MAX_SPOKEN_CHARS,
        max_work_item=capabilities.max_work_item or None,
        work_item_unit=capabilities.work_item_unit or None,
    )


def session_created(
    session_id: str,
    engine: Engine,
    config: protocol.EffectiveConfig,
    limits: protocol.Limits,
    resume: tuple[str, float] | None = None,
) -> protocol.SessionCreated:
    """``resume``: the session's new resume token and window, if it has one."""
    return protocol.SessionCreated(
        session_id=session_id,
        protocol_version=protocol.PROTOCOL_VERSION,
        engine=engine.name,
        voices=[
            protocol.VoiceDescription(
                name=v.name,
                language=v.language,
                language_name=v.language_name,
                sample_rate=v.sample_rate,
                quality=v.quality,
                streaming=v.streaming,
            )
            for v in engine.voices()
        ],
        defaults=config,
        limits=limits,
        capabilities=capabilities_message(engine.capabilities),
        resume_token=None if resume is None else resume[0],
        resume_window_s=None if resume is None else resume[1],
    )


def session_resumed(
    session_id: str,
    contexts: list[tuple[str | None, int]],
    received: dict[str | None, int],
    replayed: int,
) -> protocol.SessionResumed:
    """``contexts``: each live context's id and the characters of its open
    utterance's text; ``received``: the client's counts (``session.resume``)."""
    return protocol.SessionResumed(
        session_id=session_id,
        contexts=[
            protocol.ResumedContext(
                context_id=cid, text_chars=chars, next_sequence=received.get(cid, 0)
            )
            for cid, chars in contexts
        ],
        replayed_messages=replayed,
    )
