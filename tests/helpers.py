"""Small test-side helpers: a raw WebSocket conversation recorder and a
test-only engine wrapper that fails on a marker string.

The failing wrapper lives here, under ``tests/``, on purpose: it is not in
the engine registry, so no production configuration can enable it.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from voice_gateway_wire.testing import Gateway, gateway_process
from websockets.asyncio.client import ClientConnection, connect

from gateway.engines.base import (
    Capabilities,
    Engine,
    EngineEvent,
    EngineStream,
    SegmentRequest,
    SegmentStats,
    StreamRequest,
    SynthesisError,
    SynthesisJob,
    VoiceInfo,
)

FAIL_MARKER = "XFAILX"


@dataclass
class Transcript:
    """Everything a client received, in order."""

    items: list[dict[str, Any] | bytes] = field(default_factory=list)

    @property
    def events(self) -> list[dict[str, Any]]:
        return [i for i in self.items if isinstance(i, dict)]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    @property
    def binary(self) -> list[bytes]:
        return [i for i in self.items if isinstance(i, bytes)]

    def types(self) -> list[str]:
        return [i["type"] if isinstance(i, dict) else "<bin>" for i in self.items]


async def open_ws(url: str, **kwargs: Any) -> ClientConnection:
    ws = await connect(url, max_size=None, compression=None, **kwargs)
    return ws


async def send(ws: ClientConnection, **message: Any) -> None:
    await ws.send(json.dumps(message))


async def recv_until(
    ws: ClientConnection,
    transcript: Transcript,
    stop: str = "session.done",
    count: int = 1,
    limit_s: float = 60.0,
) -> Transcript:
    """Record messages until ``count`` events of type ``stop`` arrived."""
    seen = 0
    async with asyncio.timeout(limit_s):
        while seen < count:
            raw = await ws.recv()
            if isinstance(raw, bytes):
                transcript.items.append(raw)
                continue
            event = json.loads(raw)
            transcript.items.append(event)
            if event["type"] == stop:
                seen += 1
    return transcript


def wav_duration_ok(data: bytes) -> tuple[np.ndarray, int]:
    audio, rate = sf.read(io.BytesIO(data), dtype="float32")
    return audio, rate


class _FailingJob(SynthesisJob):
    def __init__(self, inner: SynthesisJob, after_chunks: int) -> None:
        self.inner = inner
        self.stats: SegmentStats = inner.stats
        self.after_chunks = after_chunks

    async def _events(self) -> AsyncIterator[EngineEvent]:
        chunks = 0
        async for event in self.inner:
            if chunks >= self.after_chunks:
                self.inner.cancel()
                raise SynthesisError("injected failure (test marker)")
            yield event
            chunks += 1
        if chunks <= self.after_chunks:
            raise SynthesisError("injected failure (test marker)")

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._events()

    def cancel(self) -> None:
        self.inner.cancel()


class _FailingStream(EngineStream):
    def __init__(self, inner: EngineStream, after_chunks: int) -> None:
        self.inner = inner
        self.request = inner.request
        self.after_chunks = after_chunks

    def submit(self, segment: SegmentRequest) -> SynthesisJob:
        job = self.inner.submit(segment)
        if FAIL_MARKER in segment.text:
            return _FailingJob(job, self.after_chunks)
        return job

    def cancel(self) -> None:
        self.inner.cancel()

    def close(self) -> None:
        self.inner.close()


class DelegatingEngine(Engine):
    """A real (started) engine behind a test's wrapper: everything is the
    inner engine's but the streams, which ``wrap`` may wrap."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner.settings)
        self.inner = inner
        self.name = inner.name

    async def start(self) -> None:
        return None

    def voices(self) -> Sequence[VoiceInfo]:
        return self.inner.voices()

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    def open_stream(self, request: StreamRequest) -> EngineStream:
        return self.wrap(self.inner.open_stream(request))

    def wrap(self, stream: EngineStream) -> EngineStream:
        return stream

    def live_jobs(self) -> int:
        return self.inner.live_jobs()


class FailOnMarkerEngine(DelegatingEngine):
    """Delegates to a real engine; a segment containing ``FAIL_MARKER`` fails
    after ``after_chunks`` events (so 1+ gives a mid-sentence failure)."""

    def __init__(self, inner: Engine, after_chunks: int = 2) -> None:
        super().__init__(inner)
        self.after_chunks = after_chunks

    def wrap(self, stream: EngineStream) -> EngineStream:
        return _FailingStream(stream, self.after_chunks)


ROOT = Path(__file__).resolve().parent.parent


#: a real ``python -m gateway serve`` process on a free loopback port (the
#: wire package's test helper, which the plugins' tests use too)
ServeProcess = Gateway


@contextmanager
def serve_process(
    data_dir: Path,
    package_root: Path = ROOT,
    cwd: Path = ROOT,
    port: int | None = None,
    **settings: object,
) -> Iterator[ServeProcess]:
    """Start a server with ``GATEWAY_<SETTING>`` environment overrides, run
    by this interpreter, and wait until ``/readyz`` answers 200; stopped on
    exit.  The ``gateway`` package is imported from ``package_root`` (the
    checkout, or an unpacked wheel) and the server runs in ``cwd``."""
    with gateway_process(
        package_root, data_dir, python=sys.executable, cwd=cwd, port=port, **settings
    ) as server:
        yield server
