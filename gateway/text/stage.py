"""The front-end stage: where a committed segment becomes what an engine reads.

One ``FrontEnd`` (``gateway.text.frontend``) per utterance turns each
committed segment of the client's text into its spoken form; this module is
the glue both speech paths share (the WebSocket session, ``gateway.session``,
and the HTTP API, ``gateway.http.speech``):

* ``frontend_options``: the client's controls (``input_format``,
  ``normalize``, ``emoji``, ``pronunciations``), the server lexicon and the
  engine's capabilities (``normalizes_text``, ``markup_tags``) as one
  ``FrontEndOptions``;
* ``source_words``: the engine's word timings on the client's words, with
  their character offsets in the client's text;
* ``load_lexicon``: the server-wide pronunciation file (``lexicon_file``);
* ``EngineTextBudget``: an utterance's (a request's) total of engine text
  after expansion (``max_utterance_engine_chars``), the one rule both
  surfaces apply.

``LexiconError`` is the front-end's, re-exported for the app.

Pure but for ``load_lexicon`` (read once at start).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.engines.base import (
    Capabilities,
    WordTiming,
)
from gateway.text.frontend import FrontEndOptions, InputFormat, SpokenSegment
from gateway.text.frontend.lexicon import LexiconError
from gateway.text.frontend.lexicon import load_lexicon as read_lexicon

__all__ = [
    "EngineTextBudget",
    "Lexicon",
    "LexiconError",
    "SourceWord",
    "client_position",
    "empty_spoken",
    "frontend_options",
    "load_lexicon",
    "segment_starts",
    "source_words",
]

#: the server lexicon and the session's or request's own entries, merged
Lexicon = tuple[tuple[str, str], ...]


def frontend_options(
    *,
    input_format: InputFormat,
    normalize: bool,
    emoji: str,
    pronunciations: Mapping[str, str],
    language: str,
    capabilities: Capabilities,
    lexicon: Lexicon = (),
) -> FrontEndOptions:
    """The options of one utterance's front-end.  Later pronunciation
    entries win: the client's own over the server lexicon."""
    return FrontEndOptions(
        input_format=input_format,
        normalize=normalize,
        emoji="name" if emoji == "name" else "drop",
        language=language,
        pronunciations=(*lexicon, *pronunciations.items()),
        keep_tags=frozenset(capabilities.markup_tags),
        engine_normalizes=capabilities.normalizes_text,
    )


class EngineTextBudget:
    """The engine text one utterance (one HTTP request) may read once the
    front-end has expanded it (``max_utterance_engine_chars``).  The client's
    text is capped before expansion (``max_utterance_chars``); a pronunciation
    alias repeated, or numbers read out, make it longer, and every character
    is engine work.  ``take`` charges a segment's spoken form, or refuses it
    whole (nothing is cut silently)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spent = 0

    def take(self, spoken: SpokenSegment) -> bool:
        """Charge ``spoken``'s engine text; False (nothing charged) when it
        would pass the limit."""
        if self.spent + len(spoken.text) > self.limit:
            return False
        self.spent += len(spoken.text)
        return True

    @property
    def message(self) -> str:
        """What a refused client is told (the setting named, what to do)."""
        return (
            f"the text reads as more than {self.limit} characters of engine text once"
            " expanded (pronunciation aliases, numbers and symbols read out), the server's"
            " max_utterance_engine_chars: send less text per utterance, or shorter aliases"
        )


def empty_spoken(source: str) -> SpokenSegment:
    """A segment of which nothing is spoken (it failed the front-end)."""
    return SpokenSegment(source=source, text="", spans=())


@dataclass(frozen=True)
class SourceWord:
    """A word timing on the client's text: ``text`` is the client's
    characters ``[char_start, char_end)`` of the segment (offsets into
    ``SpokenSegment.source``); times are segment-relative ms."""

    text: str
    start_ms: float
    end_ms: float
    char_start: int
    char_end: int


def source_words(spoken: SpokenSegment, words: Sequence[WordTiming]) -> tuple[SourceWord, ...]:
    """The engine's word timings mapped onto the client's words.

    Each engine word is found in the spoken text in order (Piper aligns the
    whitespace words of what it read); its spoken range maps back through the
    span map.  Spoken words that came from one client piece (``$5`` read
    "five dollars") become one word spanning both times, so every timing
    names client text.  A word the engine did not give verbatim keeps the
    mapping of the words before it (it is skipped)."""
    out: list[SourceWord] = []
    cursor = 0
    source = spoken.source
    for word in words:
        found = spoken.text.find(word.word, cursor) if word.word else -1
        if found < 0:
            continue
        cursor = found + len(word.word)
        start, end = spoken.source_range(found, cursor)
        if end <= start:
            continue
        if out and start < out[-1].char_end:  # the same client piece
            last = out[-1]
            merged_end = max(end, last.char_end)
            out[-1] = SourceWord(
                source[last.char_start : merged_end],
                last.start_ms,
                max(last.end_ms, word.end_ms),
                last.char_start,
                merged_end,
            )
            continue
        out.append(SourceWord(source[start:end], word.start_ms, word.end_ms, start, end))
    return tuple(out)


def segment_starts(text: str, segments: Sequence[str]) -> list[int]:
    """Where each committed segment starts in the client's ``text`` (the
    segmenter strips the whitespace between them; a segment not found
    verbatim is placed where the previous one ended)."""
    starts: list[int] = []
    end = 0
    for segment in segments:
        found = text.find(segment, end) if segment else -1
        start = end if found < 0 else found
        starts.append(start)
        end = start + len(segment)
    return starts


def client_position(text: str, segments: Sequence[str], position: int) -> int:
    """A ``FrontEndError.position`` (characters of the segments handed to the
    front-end, joined) as an offset in the client's ``text``."""
    fed = 0
    for segment, start in zip(segments, segment_starts(text, segments), strict=True):
        if position <= fed + len(segment):
            return start + max(0, position - fed)
        fed += len(segment)
    return len(text)


def load_lexicon(path: str) -> Lexicon:
    """The server lexicon (setting ``lexicon_file``; ``""``: none), in the
    front-end's format (``gateway.text.frontend.lexicon``: one
    ``written<TAB>spoken`` a line).  Raises ``LexiconError`` naming the line."""
    if not path:
        return ()
    return read_lexicon(Path(path).expanduser())
