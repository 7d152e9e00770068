"""Orpheus audio tokens -> SNAC codes, incrementally, with resynchronisation.

What this module is for: turning the token ids an Orpheus model streams into
whole SNAC frames, whatever way the ids are chunked on the wire.

The layout.  Audio tokens come in frames of 7 (85.3 ms of 24 kHz audio).  The
token at position ``j`` (0..6) of a frame carries the code ``id - 128266 -
j * 4096``, so each position owns its own block of 4096 ids: position ``j``
accepts exactly the ids ``[128266 + j*4096, 128266 + (j+1)*4096)``.  In SNAC's
three levels (temporal strides 4, 2 and 1 latent frames) a frame is:

    position   0    1    2    3    4    5    6
    level      0    1    2    2    1    2    2

so level 0 gets 1 code per frame, level 1 gets 2 (positions 1, 4), level 2 gets
4 (positions 2, 3, 5, 6), in that temporal order.

Resynchronisation (a model may emit a text token, skip a position, or start
mid-frame; none of that may crash the stream or shift every later frame):

1. The position ``j`` is counted from the last frame boundary the mapper
   accepted, not from the start of the stream.
2. A token valid for position ``j`` is appended; the 7th completes a frame.
3. Any other token (an id of another position, or no audio id at all)
   discards the partial frame (its tokens are counted as dropped).  If that
   token is valid for position 0 it starts the next frame; otherwise it is
   dropped too and the mapper waits, at position 0, for a token valid for
   position 0.  Because the 7 id blocks are disjoint, a token is valid for at
   most one position and the rule is unambiguous.
4. At the end of the stream a partial frame is dropped (``finish``).

So one bad token costs at most the frame it lands in (plus the tokens until
the next position-0 id), and every emitted frame is 7 tokens the model put
in the right order.  Counters (``frames``, ``dropped_tokens``,
``dropped_frames``) let the engine log how often that happens.

What it must not do: import torch, decide when the generation stops (the
caller stops at ``<end_of_speech>``), or emit a frame it has not fully seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from gateway.engines.orpheus.tokens import AUDIO_TOKEN_BASE

FRAME_TOKENS: Final = 7  #: audio tokens per SNAC frame
CODEBOOK_SIZE: Final = 4096  #: codes per SNAC level
#: the SNAC level of each frame position
POSITION_LEVELS: Final = (0, 1, 2, 2, 1, 2, 2)
SAMPLES_PER_FRAME: Final = 2048  #: 4 latent frames x SNAC 24 kHz hop of 512
SAMPLE_RATE: Final = 24000

#: one SNAC frame: the 7 codes in position order
Frame = tuple[int, int, int, int, int, int, int]


def audio_position(token_id: int) -> int | None:
    """The frame position whose id block holds ``token_id``, or None if it is
    no audio token."""
    offset = token_id - AUDIO_TOKEN_BASE
    if 0 <= offset < FRAME_TOKENS * CODEBOOK_SIZE:
        return offset // CODEBOOK_SIZE
    return None


def token_id(position: int, code: int) -> int:
    """The id that carries ``code`` at frame ``position`` (the inverse map)."""
    if not (0 <= position < FRAME_TOKENS and 0 <= code < CODEBOOK_SIZE):
        raise ValueError("position must be 0..6 and code 0..4095")
    return AUDIO_TOKEN_BASE + position * CODEBOOK_SIZE + code


def frame_tokens(frame: Sequence[int]) -> list[int]:
    """The 7 token ids of a frame of codes (for tests and benchmarks)."""
    return [token_id(j, code) for j, code in enumerate(frame)]


def levels(frames: Sequence[Frame]) -> tuple[list[int], list[int], list[int]]:
    """SNAC's three code sequences for ``frames``, each in temporal order:
    level 0 (1 per frame), level 1 (2 per frame), level 2 (4 per frame)."""
    l0 = [f[0] for f in frames]
    l1 = [c for f in frames for c in (f[1], f[4])]
    l2 = [c for f in frames for c in (f[2], f[3], f[5], f[6])]
    return l0, l1, l2


@dataclass
class CodeMapper:
    """The incremental mapper of one generation: ``push`` token ids as they
    arrive (any number at a time), get the frames they complete."""

    frames: int = 0  #: frames emitted
    dropped_tokens: int = 0  #: tokens that ended in no frame
    dropped_frames: int = 0  #: partial frames discarded by a resynchronisation
    _partial: list[int] = field(default_factory=list)

    @property
    def position(self) -> int:
        """The position the next token must have."""
        return len(self._partial)

    def push(self, token_ids: Iterable[int]) -> list[Frame]:
        out: list[Frame] = []
        partial = self._partial
        for tid in token_ids:
            j = len(partial)
            offset = tid - AUDIO_TOKEN_BASE - j * CODEBOOK_SIZE
            if 0 <= offset < CODEBOOK_SIZE:
                partial.append(offset)
                if j == FRAME_TOKENS - 1:
                    out.append(
                        (
                            partial[0],
                            partial[1],
                            partial[2],
                            partial[3],
                            partial[4],
                            partial[5],
                            partial[6],
                        )
                    )
                    partial.clear()
                continue
            if partial:
                self.dropped_tokens += len(partial)
                self.dropped_frames += 1
                partial.clear()
            if audio_position(tid) == 0:
                partial.append(tid - AUDIO_TOKEN_BASE)
            else:
                self.dropped_tokens += 1
        self.frames += len(out)
        return out

    def finish(self) -> int:
        """End of the generation: drop a partial frame; returns its length."""
        left = len(self._partial)
        if left:
            self.dropped_tokens += left
            self.dropped_frames += 1
            self._partial.clear()
        return left
