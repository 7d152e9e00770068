"""A client that loses its connection mid-reply and resumes it, and the
invariants a resumed session must keep (``session.resume``, protocol 2.1.0).

What it is for: ``bench/resume_drops.py`` and ``tests/test_resume_drops.py``
drive a real server through a ``gateway.bench.link.LinkProxy`` with it.  It
speaks the raw protocol with ``websockets`` (no ``gateway.client``), so what
it measures is the server:

* ``speak_with_drops``: one session, one reply sent as LLM tokens
  (``gateway.bench.drivers.Pacing``); the link is cut (by the client after
  its ``cut_after``-th message, or by the link at a planned byte); the
  client reconnects at once, sends
  ``session.resume`` with its per-context binary counts and its event count,
  re-sends the text the server does not hold (``session.resumed``'s
  ``text_chars``) while the "LLM" goes on producing, and reads on to
  ``session.done``.
* ``reference``: the same reply and config, whole and uninterrupted.
* ``check``: the invariants, each a named bool (``Checks``).

What it must not do: trust the server.  Every count it reports comes from
what it received; every invariant is recomputed from the bytes.
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gateway.bench.drivers import Pacing
from gateway.bench.measure import tokenize

#: the tagged frame header (docs/protocol.md, "Binary audio messages")
HEADER = struct.Struct("<BBHIIQ")

Item = dict[str, Any] | bytes


def config(seed: int, flow_control: str = "realtime", max_lead_ms: int = 300) -> dict[str, Any]:
    """The session.config of every run: tagged frames, sentence cuts, a seed."""
    out: dict[str, Any] = {
        "type": "session.config",
        "response_format": "pcm",
        "stream_audio": True,
        "frame_ms": 20,
        "framing": "tagged",
        "split_granularity": "sentence",
        "seed": seed,
        "flow_control": flow_control,
    }
    if flow_control != "none":
        out["max_lead_ms"] = max_lead_ms
    return out


@dataclass(frozen=True)
class Frame:
    context: int
    utterance: int
    sequence: int
    offset: int
    payload: bytes

    @classmethod
    def parse(cls, data: bytes) -> Frame:
        version, _flags, context, utterance, sequence, offset = HEADER.unpack_from(data)
        if version != 1:
            raise ValueError(f"tagged header version {version}")
        return cls(context, utterance, sequence, offset, data[HEADER.size :])


@dataclass
class Leg:
    """One connection of a session, as its client saw it."""

    connect_start: float
    opened: float  #: the WebSocket handshake completed
    created: dict[str, Any]
    resumed: dict[str, Any] | None = None
    resumed_at: float | None = None  #: session.resumed arrived
    first_after_at: float | None = None  #: the first message after the handshake
    #: what it got after ``session.created`` (and ``session.resumed``)
    items: list[Item] = field(default_factory=list)
    #: the counts its ``session.resume`` reported (resumed legs)
    reported_binary: int = 0
    reported_events: int = 0
    #: the link was cut while this connection was open
    cut: bool = False

    @property
    def events(self) -> int:
        return sum(1 for i in self.items if isinstance(i, dict))

    def timings(self) -> dict[str, float | None]:
        def ms(t: float | None) -> float | None:
            return None if t is None else round((t - self.opened) * 1000, 2)

        return {
            "connect_ms": round((self.opened - self.connect_start) * 1000, 2),
            "resumed_ms": ms(self.resumed_at),
            "first_frame_ms": ms(self.first_after_at),
        }


@dataclass
class Run:
    text: str
    cut_after: list[int]
    legs: list[Leg] = field(default_factory=list)
    #: characters of the reply sent (and re-sent) per leg
    sent_chars: list[int] = field(default_factory=list)
    error: str | None = None
    received: int = 0  #: messages received so far, every leg (the cut's clock)

    @property
    def items(self) -> list[Item]:
        return [i for leg in self.legs for i in leg.items]

    def trace(self) -> list[list[str]]:
        """Per leg, what arrived: event types (with their fields of note) and
        runs of binary messages as ``"<n bin>"``; for a failure's report."""
        out = []
        for leg in self.legs:
            line: list[str] = []
            run = 0
            for item in leg.items:
                if isinstance(item, bytes):
                    run += 1
                    continue
                if run:
                    line.append(f"<{run} bin>")
                    run = 0
                note = {
                    k: v
                    for k, v in item.items()
                    if k in ("code", "message", "cancelled", "sentence_index", "total_sentences")
                }
                line.append(f"{item['type']} {json.dumps(note)}" if note else item["type"])
            if run:
                line.append(f"<{run} bin>")
            out.append(line)
        return out


async def _connect(url: str) -> tuple[ClientConnection, float, float, dict[str, Any]]:
    start = time.monotonic()
    ws = await websockets.connect(url, max_size=None, compression=None, ping_interval=None)
    opened = time.monotonic()
    created = json.loads(await ws.recv())
    if created.get("type") != "session.created":
        raise RuntimeError(f"expected session.created, got {created}")
    return ws, start, opened, created


class _Llm:
    """The reply's tokens, produced on their own clock whatever the link does."""

    def __init__(self, text: str, pacing: Pacing, rng: random.Random) -> None:
        self.tokens = tokenize(text)
        self.delays = pacing.delays(len(self.tokens), rng)
        self.generated = ""
        self.finished = False
        self.grew = asyncio.Event()

    async def run(self) -> None:
        for token, delay in zip(self.tokens, self.delays, strict=True):
            await asyncio.sleep(delay)
            self.generated += token
            self.grew.set()
        self.finished = True
        self.grew.set()


@dataclass
class _Feed:
    sent: int = 0  #: characters of the reply the server holds or was sent
    done_sent: bool = False


async def _feed(ws: ClientConnection, llm: _Llm, feed: _Feed) -> None:
    """Send what the LLM produced, as it comes, then ``input.done``."""
    while True:
        if feed.sent < len(llm.generated):
            chunk, feed.sent = llm.generated[feed.sent :], len(llm.generated)
            await ws.send(json.dumps({"type": "input.text", "text": chunk}))
        elif llm.finished and not feed.done_sent:
            feed.done_sent = True
            await ws.send(json.dumps({"type": "input.done"}))
            return
        elif feed.done_sent:
            return
        else:
            llm.grew.clear()
            await llm.grew.wait()


async def speak_with_drops(
    url: str,
    text: str,
    session_config: dict[str, Any],
    cut_after: list[int],
    cut: Callable[[], object],
    pacing: Pacing,
    rng: random.Random,
    limit_s: float = 120.0,
) -> Run:
    """One reply over ``url`` (a link proxy's), resumed each time the
    connection is lost: by ``cut()``, called after each count of
    ``cut_after`` (messages received since the first ``session.created``,
    the ``session.created``/``session.resumed`` of later legs excluded), or
    by the link itself (``LinkProxy.plan_cuts``; ``cut_after`` empty)."""
    run = Run(text, sorted(cut_after))
    llm = _Llm(text, pacing, rng)
    feed = _Feed()
    producer: asyncio.Task[None] | None = None
    ws: ClientConnection | None = None
    try:
        async with asyncio.timeout(limit_s):
            ws, start, opened, created = await _connect(url)
            leg = Leg(start, opened, created)
            run.legs.append(leg)
            await ws.send(json.dumps(session_config))
            producer = asyncio.create_task(llm.run())
            while True:
                sender = asyncio.create_task(_feed(ws, llm, feed))
                outcome = await _read(ws, leg, run, cut)
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
                run.sent_chars.append(feed.sent)
                if outcome == "done" and not leg.cut:
                    return run
                ws, leg = await _resume(url, run, leg)
                if outcome == "done":
                    # the cut came after everything had arrived: the server
                    # cannot know, so the client resumes (nothing to send
                    # again) and closes, rather than leave the session
                    # suspended (or, silently cut, open) for its window
                    assert leg.resumed is not None
                    for _ in range(leg.resumed["replayed_messages"]):
                        raw = await ws.recv()
                        leg.items.append(raw if isinstance(raw, bytes) else json.loads(raw))
                    return run
                _resend_from(leg, feed, llm)
    except (TimeoutError, ConnectionClosed, OSError, RuntimeError) as exc:
        run.error = f"{type(exc).__name__}: {exc}"
        return run
    finally:
        if producer is not None:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
        if ws is not None:
            await ws.close()  # a close frame: the session ends, not suspends


async def _read(ws: ClientConnection, leg: Leg, run: Run, cut: Callable[[], object]) -> str:
    """Read until ``session.done`` ("done") or the connection is lost ("dropped")."""
    try:
        while True:
            raw = await ws.recv()
            if leg.first_after_at is None:
                leg.first_after_at = time.monotonic()
            item: Item = raw if isinstance(raw, bytes) else json.loads(raw)
            leg.items.append(item)
            run.received += 1
            if isinstance(item, dict):
                if item["type"] == "error" and item.get("fatal"):
                    raise RuntimeError(f"fatal error: {item}")
                if item["type"] == "session.done":
                    return "done"
            if run.received in run.cut_after:
                leg.cut = True
                cut()
    except ConnectionClosed:
        return "dropped"


async def _resume(url: str, run: Run, dropped: Leg) -> tuple[ClientConnection, Leg]:
    ws, start, opened, created = await _connect(url)
    binary = sum(1 for i in run.items if isinstance(i, bytes))
    leg = Leg(start, opened, created, reported_binary=binary, reported_events=dropped.events)
    token = run.legs[-1].created["resume_token"]
    run.legs.append(leg)
    await ws.send(
        json.dumps(
            {
                "type": "session.resume",
                "resume_token": token,
                # one context (None): the last sequence number received + 1
                "received": [{"context_id": None, "messages": binary}],
                "events": dropped.events,
            }
        )
    )
    # the answer: the resumed session's session.created (its next token),
    # then session.resumed
    again = json.loads(await ws.recv())
    if again.get("type") != "session.created":
        raise RuntimeError(f"resume refused: {again}")
    leg.created = again
    resumed = json.loads(await ws.recv())
    leg.resumed_at = time.monotonic()
    if resumed.get("type") != "session.resumed":
        raise RuntimeError(f"expected session.resumed, got {resumed}")
    leg.resumed = resumed
    return ws, leg


def _resend_from(leg: Leg, feed: _Feed, llm: _Llm) -> None:
    """Where the text goes on: the server holds ``text_chars`` of the open
    utterance; a context it does not list got none of the reply; a listed
    one with none open had the whole reply and its ``input.done``.  (That
    last rule holds for one utterance per context, as here: with several,
    ``text_chars`` 0 cannot tell "the last ``input.done`` arrived" from
    "none of the next utterance's text arrived".)"""
    assert leg.resumed is not None
    held = {c["context_id"]: c["text_chars"] for c in leg.resumed["contexts"]}
    if None not in held:
        feed.sent, feed.done_sent = 0, False
    elif held[None] > 0:
        feed.sent, feed.done_sent = held[None], False
    else:
        feed.sent, feed.done_sent = len(llm.generated), True


async def reference(url: str, text: str, session_config: dict[str, Any]) -> list[Item]:
    """The reply whole, on one connection no one cuts: what followed
    ``session.updated`` up to ``session.done``."""
    async with asyncio.timeout(120):
        ws, _, _, _ = await _connect(url)
        try:
            await ws.send(json.dumps(session_config))
            await ws.send(json.dumps({"type": "input.text", "text": text}))
            await ws.send(json.dumps({"type": "input.done"}))
            items: list[Item] = []
            while True:
                raw = await ws.recv()
                item: Item = raw if isinstance(raw, bytes) else json.loads(raw)
                if isinstance(item, dict) and item["type"] == "session.updated":
                    continue
                items.append(item)
                if isinstance(item, dict) and item["type"] == "error":
                    raise RuntimeError(f"the reference run failed: {item}")
                if isinstance(item, dict) and item["type"] == "session.done":
                    return items
        finally:
            await ws.close()


def pcm(items: list[Item]) -> bytes:
    """Every sample received, joined in order."""
    return b"".join(Frame.parse(i).payload for i in items if isinstance(i, bytes))


@dataclass
class Checks:
    """The invariants of one resumed session (True: held)."""

    #: per resume: ``session.resumed``'s ``next_sequence`` and the first
    #: binary message after it are the count the client reported
    sequence_continues: bool
    #: every binary message's sequence number once, from 0, without a gap
    sequence_contiguous: bool
    #: per utterance, each frame starts where the one before it ended
    offsets_continuous: bool
    #: per sentence, the payload bytes received are ``audio.done.total_bytes``
    samples_equal_audio_done: bool
    #: every audio.start / audio.done / session.done arrived exactly once
    events_once: bool
    #: one ``session.done``, last, not cancelled, counting every sentence
    session_done_ends: bool
    #: the sentences spoken are the reply's text (none lost, none twice)
    text_spoken_once: bool
    #: the joined audio is the uninterrupted run's, sample for sample
    #: (None: no reference given)
    audio_equals_reference: bool | None

    def failed(self) -> list[str]:
        return [name for name, ok in vars(self).items() if ok is False]


def check(run: Run, reference_items: list[Item] | None = None) -> Checks:
    items = run.items
    frames = [Frame.parse(i) for i in items if isinstance(i, bytes)]
    events = [i for i in items if isinstance(i, dict)]

    continues = True
    before = 0
    for leg in run.legs:
        if leg.resumed is not None:
            contexts = {c["context_id"]: c for c in leg.resumed["contexts"]}
            listed = contexts.get(None)
            if listed is None:
                continues = continues and leg.reported_binary == 0
            elif listed["next_sequence"] != leg.reported_binary:
                continues = False
            first = next((i for i in leg.items if isinstance(i, bytes)), None)
            if first is not None and Frame.parse(first).sequence != leg.reported_binary:
                continues = False
            if leg.reported_binary != before:
                continues = False  # the client's own count: a bug of this harness
        before += sum(1 for i in leg.items if isinstance(i, bytes))

    offsets_ok = True
    position: dict[int, int] = {}
    for frame in frames:
        if frame.offset != position.get(frame.utterance, 0):
            offsets_ok = False
        position[frame.utterance] = frame.offset + len(frame.payload) // 2

    per_sentence_ok = True
    open_bytes: int | None = None
    for item in items:
        if isinstance(item, bytes):
            if open_bytes is None:
                per_sentence_ok = False  # audio outside a sentence
            else:
                open_bytes += len(item) - HEADER.size
        elif item["type"] == "audio.start":
            open_bytes = 0
        elif item["type"] == "audio.done":
            if open_bytes != item["total_bytes"]:
                per_sentence_ok = False
            open_bytes = None
    done_bytes = sum(e["total_bytes"] for e in events if e["type"] == "audio.done")
    samples_ok = per_sentence_ok and sum(len(f.payload) for f in frames) == done_bytes

    keys = [
        (e["type"], e.get("utterance_index"), e.get("sentence_index"))
        for e in events
        if e["type"] in ("audio.start", "audio.done", "session.done")
    ]
    dones = [e for e in events if e["type"] == "session.done"]
    audio_dones = [e for e in events if e["type"] == "audio.done"]
    ends = (
        len(dones) == 1
        and items[-1] is dones[0]
        and not dones[0]["cancelled"]
        and dones[0]["total_sentences"] == len(audio_dones)
    )
    spoken = " ".join(e["sentence_text"] for e in events if e["type"] == "audio.start")
    equal = None if reference_items is None else pcm(items) == pcm(reference_items)
    return Checks(
        sequence_continues=continues,
        sequence_contiguous=[f.sequence for f in frames] == list(range(len(frames))),
        offsets_continuous=offsets_ok,
        samples_equal_audio_done=samples_ok,
        events_once=len(keys) == len(set(keys)),
        session_done_ends=run.error is None and ends,
        text_spoken_once=spoken.split() == run.text.split(),
        audio_equals_reference=equal,
    )
