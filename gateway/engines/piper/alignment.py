"""Word timings from the duration predictor's phoneme durations.

What this module is for: turn the frames the model spends on each phoneme id
into start/end times (ms from the start of the segment's audio) for every
written word of the segment.  Pure functions: no model, no espeak calls (the
caller passes each word's own phonemes), so it is tested without a voice.

How words are matched: espeak may expand one written word into several spoken
ones ("1,000" is "one thousand", "Dr." is "doctor") and may run short words
together ("of the" becomes one group).  So words are not matched by counting
spaces.  Each written word is phonemized on its own; the concatenation of
those sounds is aligned to the sentence's sounds (``difflib`` opcodes, stress
and punctuation ignored), which places a boundary before the first sound of
every written word; a word spans every sentence sound up to the next word's
first sound, plus the stress mark right before its first sound (the model
gives stress marks frames of their own, and they hold the word's onset).  Its
end is the end of its last sound, so a comma's pause belongs to no word.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Mapping, Sequence

import numpy as np

from gateway.engines.base import WordTiming

BOS, EOS, PAD = "^", "$", "_"
_STRESS = {"ˈ", "ˌ"}
_WORD = re.compile(r"\S+")


def text_words(text: str) -> list[str]:
    """Written words: whitespace-separated tokens with a letter or digit."""
    return [w for w in _WORD.findall(text) if any(c.isalnum() for c in w)]


def is_sound(phoneme: str) -> bool:
    """A phoneme that is spoken: not a space, punctuation or stress mark."""
    if not phoneme or phoneme in _STRESS or phoneme.isspace():
        return False
    return not all(unicodedata.category(c)[0] in "PZ" for c in phoneme)


def phoneme_id_spans(
    phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]
) -> tuple[list[int], list[tuple[int, int] | None]]:
    """Piper's ids (BOS, PAD, then each phoneme's ids and a PAD, then EOS) and
    for each phoneme the ``[first, end)`` range of its ids including its PAD;
    ``None`` for a phoneme the voice does not know (Piper skips it too)."""
    ids: list[int] = [*id_map[BOS], *id_map[PAD]]
    spans: list[tuple[int, int] | None] = []
    for phoneme in phonemes:
        if phoneme not in id_map:
            spans.append(None)
            continue
        first = len(ids)
        ids.extend(id_map[phoneme])
        ids.extend(id_map[PAD])
        spans.append((first, len(ids)))
    ids.extend(id_map[EOS])
    return ids, spans


def _map_positions(source: Sequence[str], target: Sequence[str]) -> list[int]:
    """For each index of ``source``, the index of ``target`` it aligns to."""
    mapped = [0] * len(source)
    matcher = difflib.SequenceMatcher(None, list(source), list(target), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for i in range(i1, i2):
            if tag in ("equal", "replace") and j2 > j1:
                mapped[i] = j1 + (i - i1) * (j2 - j1) // (i2 - i1)
            else:  # deleted: sits where the target resumes
                mapped[i] = min(j1, max(0, len(target) - 1))
    return mapped


def word_boundaries(
    word_sounds: Sequence[Sequence[str]], sentence_sounds: Sequence[str]
) -> list[int]:
    """Index into ``sentence_sounds`` where each word starts (non-decreasing;
    strictly increasing when there are at least as many sounds as words)."""
    count = len(word_sounds)
    flat: list[str] = []
    first_index: list[int] = []
    for sounds in word_sounds:
        first_index.append(len(flat))
        flat.extend(sounds)
    mapped = _map_positions(flat, sentence_sounds) if flat else []
    total = len(sentence_sounds)
    starts: list[int] = []
    for k in range(count):
        if k == 0:
            starts.append(0)
            continue
        index = first_index[k]
        starts.append(mapped[index] if index < len(mapped) else total)
    # monotonic, one sound at least per word when possible
    for k in range(1, count):
        starts[k] = max(starts[k], starts[k - 1] + 1)
    for k in range(count - 1, 0, -1):
        limit = total - 1 if k == count - 1 else starts[k + 1] - 1
        starts[k] = max(0, min(starts[k], limit))
    return starts


def align_words(
    words: Sequence[str],
    word_phonemes: Sequence[Sequence[str]],
    phonemes: Sequence[str],
    spans: Sequence[tuple[int, int] | None],
    durations: np.ndarray,
    ms_per_frame: float,
) -> tuple[WordTiming, ...]:
    """Word timings of one segment.

    ``words``: written words; ``word_phonemes``: each word phonemized alone;
    ``phonemes``/``spans``: the segment's phonemes and their id ranges;
    ``durations``: frames per phoneme id.
    """
    if not words:
        return ()
    sound_positions = [i for i, p in enumerate(phonemes) if is_sound(p) and spans[i] is not None]
    sentence_sounds = [phonemes[i] for i in sound_positions]
    word_sounds = [[p for p in ps if is_sound(p)] for ps in word_phonemes]
    starts = word_boundaries(word_sounds, sentence_sounds)
    frame_at = np.concatenate([[0], np.cumsum(durations)])
    timings: list[WordTiming] = []
    for k, word in enumerate(words):
        lo = starts[k]
        hi = starts[k + 1] if k + 1 < len(words) else len(sentence_sounds)
        if not sentence_sounds:
            timings.append(WordTiming(word, 0.0, 0.0))
            continue
        lo = min(lo, len(sentence_sounds) - 1)
        hi = max(hi, lo + 1)
        first = sound_positions[lo]
        # a stress mark before the first sound carries real frames (the onset)
        while first > 0 and phonemes[first - 1] in _STRESS and spans[first - 1] is not None:
            first -= 1
        first_span = spans[first]
        last_span = spans[sound_positions[hi - 1]]
        assert first_span is not None and last_span is not None
        start = float(frame_at[first_span[0]]) * ms_per_frame
        end = float(frame_at[last_span[1]]) * ms_per_frame
        timings.append(WordTiming(word, start, end))
    return tuple(timings)
