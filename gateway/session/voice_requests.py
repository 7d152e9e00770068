"""The WebSocket's voice requests: the I/O half of ``voice.*`` and of the
voice names in ``session.config``.

The session core never waits on the voice store.  A ``voice.list`` /
``voice.add`` / ``voice.remove`` comes back from ``Session.handle`` as an
``AnswerVoiceRequest`` action, which the route answers here (the store's I/O
runs in a worker thread, through the functions the HTTP routes use); a
``session.config`` naming an alias (``alloy`` ...) or an uploaded voice has
its names resolved here before the core applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from gateway import protocol
from gateway.engines.base import Engine
from gateway.settings import Settings
from gateway.voices.catalog import (
    add_voice,
    decode_base64_audio,
    find_speakable_voice,
    remove_voice,
    voice_listing,
)
from gateway.voices.store import VoiceStore

VoiceRequest = protocol.VoiceList | protocol.VoiceAdd | protocol.VoiceRemove


@dataclass(frozen=True)
class VoiceDesk:
    """What answering a voice request needs."""

    engine: Engine
    settings: Settings
    store: VoiceStore

    async def answer(self, message: VoiceRequest) -> protocol.ServerMessage:
        """The result message, or ``GatewayError`` (reported non-fatally
        with the request's ``request_id``)."""
        engine, settings, store = self.engine, self.settings, self.store
        match message:
            case protocol.VoiceList(request_id=rid):
                listing = await voice_listing(engine, settings, store)
                return protocol.VoiceListResult(request_id=rid, voices=listing["data"])
            case protocol.VoiceAdd(request_id=rid):
                voice = await add_voice(
                    engine,
                    settings,
                    store,
                    name=message.name,
                    data=decode_base64_audio(message.audio),
                    consent=message.consent,
                    ref_text=message.ref_text,
                    description=message.description,
                )
                return protocol.VoiceAddResult(request_id=rid, voice=voice)
            case protocol.VoiceRemove(name=name, request_id=rid):
                removed = await remove_voice(engine, settings, store, name)
                return protocol.VoiceRemoveResult(
                    request_id=rid, name=removed["name"], id=removed["id"]
                )

    async def resolve_config_voices(
        self, message: protocol.SessionConfig
    ) -> protocol.SessionConfig:
        """``voice``/``speaker`` rewritten to engine voice names when they
        name an alias or an uploaded voice (as the HTTP API resolves them);
        unknown names raise ``GatewayError``.  Conflicting ``voice`` and
        ``speaker`` are left for the validator to report."""
        names = {}
        given = [v for v in (message.voice, message.speaker) if isinstance(v, str)]
        conflicting = len({v.strip().casefold() for v in given}) > 1
        for field_name in () if conflicting else ("voice", "speaker"):
            raw = getattr(message, field_name)
            if isinstance(raw, str) and self.engine.find_voice(raw) is None:
                voice = await find_speakable_voice(self.engine, self.settings, self.store, raw)
                names[field_name] = voice.name
        if names:
            message = msgspec.structs.replace(message, **names)
        return message
