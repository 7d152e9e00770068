"""The per-utterance front-end: reading by input format, then the rewriting
stages, with carried state.

Order of the stages (each sees only text the earlier ones left unfrozen):

1. the reader of the input format: Markdown (:mod:`.markdown`), SSML
   (:mod:`.ssml`) or plain (the text as it is);
2. pronunciations (:mod:`.lexicon`), before normalization, so an alias can
   name a form the normalizer would have read otherwise;
3. emoji (:mod:`.emoji`), dropped or named;
4. normalization for the language (:mod:`.normalize`), unless it is off or
   the engine normalizes itself.

``plain`` with normalization off is the identity, byte for byte (only a
lexicon, when one is given, still applies).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gateway.text.frontend.emoji import drop_emoji, name_emoji
from gateway.text.frontend.holdback import hold_back
from gateway.text.frontend.lexicon import Lexicon
from gateway.text.frontend.markdown import MarkdownReader
from gateway.text.frontend.normalize import normalizer_for
from gateway.text.frontend.pieces import Edit, Piece, rewrite, to_segment
from gateway.text.frontend.ssml import SsmlError, SsmlReader
from gateway.text.frontend.types import FrontEndError, FrontEndOptions, SpokenSegment

__all__ = ["FrontEnd", "hold_back", "warm_up"]

_FINISH_MESSAGES = {1: "the text ends inside a tag", 2: "elements left open at the end"}


class FrontEnd:
    """One per utterance (per context); carries state across segments: open
    emphasis, code fence, table, list, SSML tag stack.  Pure, no I/O."""

    def __init__(self, options: FrontEndOptions) -> None:
        self.options = options
        self._offset = 0  # characters of the utterance's segments seen so far
        tags = frozenset(t.strip("<>/").lower() for t in options.keep_tags)
        self._markdown = (
            MarkdownReader(keep_tags=tags) if options.input_format == "markdown" else None
        )
        self._ssml = SsmlReader(keep_tags=tags) if options.input_format == "ssml" else None
        stages: list[Callable[[str], Iterable[Edit]]] = []
        lexicon = Lexicon(options.pronunciations)
        if lexicon:
            stages.append(lexicon.edits)
        rewriting = options.input_format != "plain" or options.normalize
        if rewriting:
            stages.append(name_emoji if options.emoji == "name" else drop_emoji)
        if options.normalize and not options.engine_normalizes:
            normalizer = normalizer_for(options.language)
            if normalizer is not None:
                stages.append(normalizer)
        self._stages = tuple(stages)

    def process(self, segment: str) -> SpokenSegment:
        """The spoken form of one committed segment.

        Raises :class:`FrontEndError` on malformed SSML; its ``spoken`` is
        what was valid in the segment before the error, and its ``position``
        the offset in the utterance (the segments processed so far, joined).
        """
        base = self._offset
        self._offset += len(segment)
        try:
            pieces = self._read(segment)
        except SsmlError as exc:
            partial = self._finish_pieces(segment[: exc.position], exc.pieces)
            raise FrontEndError(exc.message, base + exc.position, spoken=partial) from None
        return self._finish_pieces(segment, pieces)

    def finish(self) -> SpokenSegment | None:
        """End of utterance: resets carried state.  Returns None (nothing is
        held back as text), or raises :class:`FrontEndError` for SSML left
        unfinished (an open tag or element)."""
        if self._markdown is not None:
            self._markdown.finish()
        if self._ssml is not None:
            problem = self._ssml.finish()
            if problem is not None:
                raise FrontEndError(_FINISH_MESSAGES[problem], self._offset)
        self._offset = 0
        return None

    def _read(self, segment: str) -> list[Piece]:
        if self._markdown is not None:
            return self._markdown.read(segment)
        if self._ssml is not None:
            return self._ssml.read(segment)
        return [Piece(segment, 0, len(segment))] if segment else []

    def _finish_pieces(self, segment: str, pieces: list[Piece]) -> SpokenSegment:
        if not self._stages and self._markdown is None and self._ssml is None:
            return to_segment(segment, pieces, blank_is_silent=False)  # the identity
        for stage in self._stages:
            pieces = rewrite(pieces, stage)
        return to_segment(segment, pieces)


def warm_up() -> None:
    """Load what the first segments would otherwise load on the event loop
    (the emoji package's tables; a few milliseconds).  Call once at start."""
    fe = FrontEnd(FrontEndOptions(emoji="name"))
    fe.process("**Warm** up 👍 at $1.50 on 2026-12-01, see https://example.com.")
    fe.finish()
