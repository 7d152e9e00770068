"""A session's audio streams: one shared by all its contexts under ``raw``
framing (their audio never interleaves), one per context under ``tagged``
(their frames interleave).  Each is an ``AudioStream``
(``gateway.session.audio_stream``) built on the session's ``StreamEnv``."""

from __future__ import annotations

import asyncio

from gateway.protocol import Framing
from gateway.session.audio_stream import AudioStream, StreamEnv
from gateway.session.contexts import Context


class SessionStreams:
    def __init__(self, env: StreamEnv) -> None:
        self.env = env
        self.shared = AudioStream(env, "shared")
        #: a context's own stream under tagged framing
        self._by_context: dict[Context, AudioStream] = {}

    def for_context(self, ctx: Context, framing: Framing) -> AudioStream:
        """The stream that speaks ``ctx``'s audio under ``framing``."""
        if framing == "raw":
            return self.shared
        stream = self._by_context.get(ctx)
        if stream is None:
            stream = AudioStream(self.env, f"ctx{ctx.number}")
            self._by_context[ctx] = stream
        return stream

    def forget(self, ctx: Context) -> None:
        """``ctx`` was forgotten (idle): its stream, if any, goes with it."""
        stream = self._by_context.pop(ctx, None)
        if stream is not None:
            stream.discard()

    def all(self) -> list[AudioStream]:
        return [self.shared, *self._by_context.values()]

    def cancel_jobs(self) -> None:
        """Stop every stream's engine work (the connection is gone)."""
        for stream in self.all():
            stream.cancel_jobs()

    async def settle(self, timeout_s: float = 1.0) -> None:
        """Wait briefly for the streams to report the cancel of in-flight audio."""
        for stream in self.all():
            for _ in range(round(timeout_s / 0.01)):
                if stream.current is None:
                    break
                await asyncio.sleep(0.01)

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.all()), return_exceptions=True)
