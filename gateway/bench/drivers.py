"""Drive one utterance against a server and record when everything happened.

Four drivers produce the same ``Record``:

* ``GatewayUser``: the gateway's protocol through ``gateway.client`` with the
  recommended low-latency config;
* ``VllmOmniUser``: only the messages of vllm-omni's documented streaming
  protocol (``session.config``, ``input.text``, ``input.done``,
  ``session.close``; unknown server messages ignored), its defaults (one WAV
  per sentence); time to first audio is taken from ``input.done``;
* ``PiperHttpUser``: Piper's own HTTP server (``POST /synthesize`` returns one
  WAV per request).  ``flush`` posts the sentence; ``llm`` cuts the token
  stream with the gateway's sentence segmenter and posts each sentence as soon
  as it is complete, in order, on one connection (re-opened when the server
  answers ``Connection: close``, as Werkzeug's development server does);
* ``WyomingUser``: wyoming-piper (Home Assistant's Piper server) through the
  Wyoming protocol's streaming events, as Home Assistant sends them:
  ``synthesize-start``, one ``synthesize-chunk`` per token, ``synthesize-stop``;
  the server answers each sentence it cuts with ``audio-start``,
  ``audio-chunk``s and ``audio-stop``, and the stream with
  ``synthesize-stopped``.  A connection per user, kept across utterances.

Times are ``time.perf_counter()`` seconds, stamped when a message came off the
socket.  This module measures; ``gateway.bench.measure`` interprets.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import time
import wave
from dataclasses import dataclass, field
from typing import Any, Literal

from websockets.asyncio.client import ClientConnection, connect

from gateway.bench.measure import Piece, playout, sentence_ready_times, tokenize
from gateway.client import AudioFrame, Client, Disconnected, frame_ms
from gateway.protocol import AudioCancelled, AudioStart, Error, SessionConfig, SessionDone
from gateway.text.segmenter import Segmenter, end_kind

Scenario = Literal["flush", "llm", "barge-in", "capacity", "overload"]


@dataclass
class Pacing:
    """How the client sends text: ``flush`` all at once, or LLM-like tokens."""

    streamed: bool
    token_rate: float = 20.0  #: tokens per second
    jitter: float = 0.5  #: each delay is ``(1 ± jitter) / token_rate``, uniform

    def delays(self, count: int, rng: random.Random) -> list[float]:
        base = 1.0 / self.token_rate
        return [max(0.0, base * (1 + rng.uniform(-self.jitter, self.jitter))) for _ in range(count)]


@dataclass
class Record:
    """One utterance as the client saw it."""

    target: str
    scenario: str
    level: int
    user: int
    index: int
    text: str
    sends: list[tuple[float, str]] = field(default_factory=list)
    done_at: float | None = None  #: input.done (or the last POST) sent
    sentences: list[str] = field(default_factory=list)
    piece_sentence: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    durations_ms: list[float] = field(default_factory=list)
    ready_at: list[float] | None = None  #: per sentence, when known directly (Piper)
    first_byte_at: float | None = None  #: first audio byte (Piper: first body byte)
    ended_at: float | None = None
    bytes: int = 0
    compute_rtf: float | None = None
    server_first_audio_ms: float | None = None
    cancel_at: float | None = None
    cancelled_at: float | None = None
    last_frame_at: float | None = None
    cancelled: bool = False
    error: str | None = None
    error_at: float | None = None  #: when the (first) error event arrived
    #: a ``busy`` refusal's retry advice (the overload scenario)
    retry_after_ms: int | None = None
    #: how long a ``busy`` refusal waited in the server's admission queue
    #: (protocol 1.4; None: refused at once, or an older server)
    waited_ms: int | None = None

    def pieces(self) -> list[Piece]:
        if self.ready_at is not None:
            ready = self.ready_at
        else:
            end = self.done_at if self.done_at is not None else float("inf")
            ready = sentence_ready_times(self.sends, self.sentences, end)
        return [
            Piece(arrival=a, duration_ms=d, ready_at=ready[s] if s < len(ready) else a)
            for a, d, s in zip(self.arrivals, self.durations_ms, self.piece_sentence, strict=True)
        ]

    def measures(self, prebuffer_ms: float = 0.0) -> dict[str, Any]:
        """Everything derived for this utterance, in milliseconds (JSON-ready)."""
        first_audio = self.first_byte_at
        if first_audio is None and self.arrivals:
            first_audio = self.arrivals[0]
        first_send = self.sends[0][0] if self.sends else None

        def ms(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round((a - b) * 1000.0, 2)

        out: dict[str, Any] = {
            "kind": "utterance",
            "target": self.target,
            "scenario": self.scenario,
            "level": self.level,
            "user": self.user,
            "index": self.index,
            "chars": len(self.text),
            "ttfa_first_token_ms": ms(first_audio, first_send),
            "ttfa_flush_ms": ms(first_audio, self.done_at),
            "bytes": self.bytes,
            "sentences": len(self.sentences),
            # segments cut below clause level (a segment that is not the last
            # and ends in neither sentence nor clause punctuation)
            "subclause_cuts": sum(1 for t in self.sentences[:-1] if end_kind(t) is None),
            "error": self.error,
        }
        if self.scenario == "overload":
            out.update(
                busy=bool(self.error and self.error.startswith("busy")),
                retry_after_ms=self.retry_after_ms,
                answered_after_first_text_ms=ms(self.error_at, first_send),
                queue_waited_ms=self.waited_ms,
            )
        if self.scenario == "barge-in":
            out.update(
                cancelled=self.cancelled,
                cancel_to_report_ms=ms(self.cancelled_at, self.cancel_at),
                cancel_to_last_frame_ms=(
                    max(0.0, ms(self.last_frame_at, self.cancel_at) or 0.0)
                    if self.cancel_at is not None and self.last_frame_at is not None
                    else None
                ),
            )
            return out
        heard = playout(self.pieces(), prebuffer_ms)
        span = (self.arrivals[-1] - self.arrivals[0]) if len(self.arrivals) > 1 else 0.0
        out.update(
            audio_ms=round(heard.audio_ms, 1),
            underruns=heard.underruns,
            underrun_ms=round(heard.underrun_ms, 1),
            starvations=heard.starvations,
            starvation_ms=round(heard.starvation_ms, 1),
            max_gap_ms=round(max((g.ms for g in heard.gaps), default=0.0), 1),
            first_underrun_at_ms=(
                None if heard.first_underrun_ms is None else round(heard.first_underrun_ms, 1)
            ),
            compute_rtf=self.compute_rtf,
            server_first_audio_ms=self.server_first_audio_ms,
            # audio received per second of wall time, first to last arrival
            delivery_rate=round(heard.audio_ms / 1000.0 / span, 2) if span > 0 else None,
        )
        return out

    def timeline(self) -> dict[str, Any]:
        """Text sends and audio arrivals relative to the first send, for the report's
        plot; frames that arrived within 5 ms of each other are merged into one piece."""
        origin = self.sends[0][0] if self.sends else (self.arrivals[0] if self.arrivals else 0.0)
        pieces: list[list[float]] = []
        for a, d in zip(self.arrivals, self.durations_ms, strict=True):
            at = (a - origin) * 1000.0
            if pieces and at - pieces[-1][2] <= 5.0:
                pieces[-1][1] += d
                pieces[-1][2] = at
            else:
                pieces.append([at, d, at])
        return {
            "kind": "timeline",
            "target": self.target,
            "scenario": self.scenario,
            "user": self.user,
            "index": self.index,
            "sends_ms": [round((t - origin) * 1000, 1) for t, _ in self.sends],
            "arrivals_ms": [round(p[0], 1) for p in pieces],
            "durations_ms": [round(p[1], 1) for p in pieces],
            "done_ms": None if self.done_at is None else round((self.done_at - origin) * 1000, 1),
        }


async def _send_paced(
    send: Any, record: Record, tokens: list[str], pacing: Pacing, rng: random.Random
) -> None:
    if not pacing.streamed:
        t = await send("".join(tokens))
        record.sends.append((t, "".join(tokens)))
        return
    for token, delay in zip(tokens, pacing.delays(len(tokens), rng), strict=True):
        t = await send(token)
        record.sends.append((t, token))
        await asyncio.sleep(delay)


# --- the gateway's protocol -------------------------------------------------------------


class GatewayUser:
    """One connection (session); utterances run one after another on it."""

    name = "gateway"

    def __init__(self, url: str, voice: str | None = None, local_host: str | None = None) -> None:
        self.url = url
        self.voice = voice
        self.local_host = local_host
        self.client: Client | None = None

    async def open(self) -> None:
        config = SessionConfig(response_format="pcm", stream_audio=True, frame_ms=20)
        self.client = await Client.connect(
            self.url, config, voice=self.voice, local_host=self.local_host
        )
        # drain session.updated (and anything else) left by the handshake
        while self.client.queued:
            await self.client.next_event(1.0)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    async def utterance(
        self, record: Record, pacing: Pacing, rng: random.Random, cancel_after_s: float | None
    ) -> Record:
        client = self.client
        assert client is not None
        tokens = tokenize(record.text)

        async def sender() -> None:
            await _send_paced(client.send_text, record, tokens, pacing, rng)
            record.done_at = await client.done()

        task = asyncio.create_task(sender())
        cancel_task: asyncio.Task[None] | None = None

        async def cancel_later(delay: float) -> None:
            await asyncio.sleep(delay)
            record.cancel_at = await client.cancel()

        try:
            async with asyncio.timeout(120):
                while True:
                    event = await client.next_event()
                    match event:
                        case AudioStart():
                            record.sentences.append(event.sentence_text)
                        case AudioFrame():
                            if event.is_wav_header:
                                continue
                            record.arrivals.append(event.received_at)
                            record.durations_ms.append(frame_ms(event))
                            record.piece_sentence.append(len(record.sentences) - 1)
                            record.bytes += len(event.data)
                            if record.cancel_at is not None:
                                record.last_frame_at = event.received_at
                            if cancel_after_s is not None and cancel_task is None:
                                cancel_task = asyncio.create_task(cancel_later(cancel_after_s))
                        case AudioCancelled():
                            record.cancelled_at = time.perf_counter()
                            record.cancelled = True
                            if record.last_frame_at is None:
                                record.last_frame_at = record.cancel_at
                        case SessionDone():
                            record.ended_at = time.perf_counter()
                            if event.metrics is not None:
                                record.compute_rtf = event.metrics.compute_rtf
                                record.server_first_audio_ms = event.metrics.first_audio_ms
                            break
                        case Error():
                            if record.error is None:
                                record.error_at = time.perf_counter()
                                record.retry_after_ms = event.retry_after_ms
                                record.waited_ms = event.waited_ms
                            record.error = f"{event.code}: {event.message}"
                            if event.fatal:
                                break
                        case Disconnected():
                            record.error = f"disconnected: {event.code} {event.reason}"
                            break
        except TimeoutError:
            record.error = "timeout"
        finally:
            await task
            if cancel_task is not None:
                await cancel_task
        return record


# --- vllm-omni's protocol ----------------------------------------------------------------


def _wav_ms(data: bytes) -> float:
    try:
        with wave.open(io.BytesIO(data)) as w:
            return float(w.getnframes() / w.getframerate() * 1000.0)
    except (wave.Error, EOFError):
        return 0.0


class VllmOmniUser:
    """Speaks only vllm-omni's documented streaming messages."""

    name = "vllm-omni"

    def __init__(self, url: str, voice: str | None = None) -> None:
        self.url = url
        self.voice = voice
        self.ws: ClientConnection | None = None

    async def open(self) -> None:
        self.ws = await connect(self.url, max_size=None, compression=None)
        config: dict[str, Any] = {"type": "session.config"}
        if self.voice:
            config["voice"] = self.voice
        await self.ws.send(json.dumps(config))

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.send(json.dumps({"type": "session.close"}))
            await self.ws.close()

    async def utterance(
        self, record: Record, pacing: Pacing, rng: random.Random, cancel_after_s: float | None
    ) -> Record:
        ws = self.ws
        assert ws is not None
        tokens = tokenize(record.text)

        async def send(text: str) -> float:
            await ws.send(json.dumps({"type": "input.text", "text": text}))
            return time.perf_counter()

        async def sender() -> None:
            await _send_paced(send, record, tokens, pacing, rng)
            await ws.send(json.dumps({"type": "input.done"}))
            record.done_at = time.perf_counter()

        task = asyncio.create_task(sender())
        try:
            async with asyncio.timeout(120):
                async for message in ws:
                    now = time.perf_counter()
                    if isinstance(message, bytes):
                        record.arrivals.append(now)
                        record.durations_ms.append(_wav_ms(message))
                        record.piece_sentence.append(len(record.sentences) - 1)
                        record.bytes += len(message)
                        continue
                    event = json.loads(message)
                    kind = event.get("type")
                    if kind == "audio.start":
                        record.sentences.append(event.get("sentence_text", ""))
                    elif kind == "error":
                        record.error = f"{event.get('code')}: {event.get('message')}"
                    elif kind == "session.done":
                        record.ended_at = now
                        break
                    # anything else (session.created, session.updated, ...) is ignored
        except TimeoutError:
            record.error = "timeout"
        finally:
            await task
        return record


# --- Piper's HTTP server ---------------------------------------------------------------------


class HttpConnection:
    """A minimal HTTP/1.1 client that timestamps the first body byte."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[float, float, bytes]:
        """Returns (first body byte time, last body byte time, body)."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Content-Type: application/json\r\nConnection: keep-alive\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode("ascii") + body)
        await writer.drain()
        status = await reader.readline()
        if not status.startswith(b"HTTP/1.") or b" 200 " not in status:
            raise OSError(f"HTTP error: {status!r}")
        length = 0
        close = False
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
            elif name.strip().lower() == "connection" and value.strip().lower() == "close":
                close = True
        first = await reader.readexactly(1)
        first_at = time.perf_counter()
        rest = await reader.readexactly(length - 1)
        done_at = time.perf_counter()
        if close:
            await self.aclose()
        return first_at, done_at, first + rest

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()
        self._reader = self._writer = None


class PiperHttpUser:
    """Piper's own HTTP server driven the closest equivalent way."""

    name = "piper"

    def __init__(self, host: str, port: int) -> None:
        self.conn = HttpConnection(host, port)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        await self.conn.aclose()

    async def utterance(
        self, record: Record, pacing: Pacing, rng: random.Random, cancel_after_s: float | None
    ) -> Record:
        if cancel_after_s is not None:
            raise ValueError("Piper's HTTP API has no cancel: barge-in is not measured for it")
        tokens = tokenize(record.text)
        ready: asyncio.Queue[tuple[str, float] | None] = asyncio.Queue()
        segmenter = Segmenter("sentence")
        record.ready_at = []

        async def send(text: str) -> float:
            now = time.perf_counter()
            for sentence in segmenter.push(text):
                await ready.put((sentence, now))
            return now

        async def sender() -> None:
            await _send_paced(send, record, tokens, pacing, rng)
            now = time.perf_counter()
            for sentence in segmenter.flush():
                await ready.put((sentence, now))
            record.done_at = now
            await ready.put(None)

        task = asyncio.create_task(sender())
        try:
            while (item := await ready.get()) is not None:
                sentence, ready_at = item
                record.sentences.append(sentence)
                record.ready_at.append(ready_at)
                body = json.dumps({"text": sentence}).encode()
                first_at, done_at, wav = await self.conn.post("/synthesize", body)
                if record.first_byte_at is None:
                    record.first_byte_at = first_at
                record.arrivals.append(done_at)
                record.durations_ms.append(_wav_ms(wav))
                record.piece_sentence.append(len(record.sentences) - 1)
                record.bytes += len(wav)
            record.ended_at = time.perf_counter()
        except (OSError, asyncio.IncompleteReadError) as exc:
            record.error = f"http: {exc}"
        finally:
            await task
        return record


# --- wyoming-piper (the Wyoming protocol) ------------------------------------------------------


async def write_wyoming(
    writer: asyncio.StreamWriter, kind: str, data: dict[str, Any] | None = None
) -> None:
    """One Wyoming event: a JSON header line, then the data as JSON bytes."""
    header: dict[str, Any] = {"type": kind, "version": "1.10.2"}
    body = json.dumps(data, ensure_ascii=False).encode() if data else b""
    if body:
        header["data_length"] = len(body)
    writer.write(json.dumps(header, ensure_ascii=False).encode() + b"\n" + body)
    await writer.drain()


async def read_wyoming(reader: asyncio.StreamReader) -> tuple[str, dict[str, Any], bytes] | None:
    """One Wyoming event (type, data, payload), or None at the end of the stream."""
    line = await reader.readline()
    if not line:
        return None
    header = json.loads(line)
    data: dict[str, Any] = dict(header.get("data") or {})
    if header.get("data_length"):
        data.update(json.loads(await reader.readexactly(header["data_length"])))
    payload = b""
    if header.get("payload_length"):
        payload = await reader.readexactly(header["payload_length"])
    return str(header["type"]), data, payload


class WyomingUser:
    """wyoming-piper driven with the streaming events, one utterance at a time.

    wyoming-piper does not say which text each sentence holds; the record's
    sentences are the gateway's sentence segmenter's cut of the same stream
    (its rules are close to wyoming-piper's), used for when each sentence's
    text was complete."""

    name = "wyoming"

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()
        self._reader = self._writer = None

    async def utterance(
        self, record: Record, pacing: Pacing, rng: random.Random, cancel_after_s: float | None
    ) -> Record:
        if cancel_after_s is not None:
            raise ValueError("wyoming-piper has no cancel: barge-in is not measured for it")
        reader, writer = self._reader, self._writer
        assert reader is not None and writer is not None
        tokens = tokenize(record.text)
        segmenter = Segmenter("sentence")
        record.ready_at = []

        def note(sentences: list[str], at: float) -> None:
            assert record.ready_at is not None
            record.sentences.extend(sentences)
            record.ready_at.extend(at for _ in sentences)

        async def send(text: str) -> float:
            await write_wyoming(writer, "synthesize-chunk", {"text": text})
            now = time.perf_counter()
            note(segmenter.push(text), now)
            return now

        async def sender() -> None:
            await write_wyoming(writer, "synthesize-start", {})
            await _send_paced(send, record, tokens, pacing, rng)
            await write_wyoming(writer, "synthesize-stop")
            record.done_at = time.perf_counter()
            note(segmenter.flush(), record.done_at)

        task = asyncio.create_task(sender())
        spoken = -1  # index of the sentence whose audio is arriving
        try:
            async with asyncio.timeout(120):
                while (event := await read_wyoming(reader)) is not None:
                    kind, data, payload = event
                    now = time.perf_counter()
                    if kind == "audio-start":
                        spoken += 1
                    elif kind == "audio-chunk" and payload:
                        frame = int(data["width"]) * int(data["channels"])
                        record.arrivals.append(now)
                        record.durations_ms.append(len(payload) / frame / data["rate"] * 1000.0)
                        record.piece_sentence.append(max(spoken, 0))
                        record.bytes += len(payload)
                        if record.first_byte_at is None:
                            record.first_byte_at = now
                    elif kind == "error":
                        record.error = f"wyoming: {data.get('code')}: {data.get('text')}"
                        break
                    elif kind == "synthesize-stopped":
                        record.ended_at = now
                        break
                else:
                    record.error = "wyoming: connection closed"
        except TimeoutError:
            record.error = "timeout"
        except (OSError, asyncio.IncompleteReadError) as exc:
            record.error = f"wyoming: {exc}"
        finally:
            await task
        return record
