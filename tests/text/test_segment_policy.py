"""Tests of the listener-driven segmentation policy (``gateway/text/policy.py``)
and the listener buffer estimate (``gateway/flow/listener.py``).

Pure: text + arrival times + the listener's buffer -> segments.  The listener
is simulated as the policy plans it: a committed segment's audio starts
``lead`` after its commit (or when the previous one ends) and lasts its
estimated length.  Rules: ``docs/segmentation.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.bench.measure import tokenize
from gateway.text.duration import estimate_seconds
from gateway.text.policy import SUB_CLAUSE_KINDS, Cut, PolicyConfig, SegmentPolicy
from gateway.text.segmenter import Segmenter

CONFIG = PolicyConfig()


@dataclass
class Listener:
    """The simulated listener: when its buffer runs dry."""

    config: PolicyConfig
    base_s: float = 0.0  #: audio ahead at time 0 (an earlier utterance still playing)
    dry_at: float | None = None
    commits: list[tuple[float, Cut]] = field(default_factory=list)

    def ahead(self, t: float) -> float:
        end = self.base_s if self.dry_at is None else self.dry_at
        return max(0.0, end - t)

    def commit(self, t: float, cuts: list[Cut]) -> None:
        for cut in cuts:
            end = max(t + self.ahead(t), t + self.config.lead_s)
            self.dry_at = end + estimate_seconds(cut.text, self.config.speed)
            self.commits.append((t, cut))


def simulate(
    events: list[tuple[float, str]],
    *,
    config: PolicyConfig = CONFIG,
    base_s: float = 0.0,
    extra_polls: tuple[float, ...] = (),
    end_at: float | None = None,
    granularity: str = "auto",
) -> tuple[list[Cut], Listener]:
    """Push each ``(time, text)``, poll whenever the policy asks (and at the
    extra times), flush at ``end_at`` (default: the last time)."""
    policy = SegmentPolicy(Segmenter(granularity), config)  # type: ignore[arg-type]
    listener = Listener(config, base_s)
    end = end_at if end_at is not None else (events[-1][0] if events else 0.0)
    todo = sorted(
        [(t, 0, text) for t, text in events] + [(t, 1, "") for t in extra_polls if t <= end],
        key=lambda x: (x[0], x[1]),
    )
    now = 0.0

    def polls_until(limit: float) -> None:
        nonlocal now
        while True:
            at = policy.next_check(now, listener.ahead(now))
            if at is None or at >= limit:
                return
            assert at > now
            now = at
            listener.commit(now, policy.poll(now, listener.ahead(now)))

    for t, is_poll, text in todo:
        polls_until(t)
        now = t
        if is_poll:
            listener.commit(now, policy.poll(now, listener.ahead(now)))
        else:
            listener.commit(now, policy.push(text, now, listener.ahead(now)))
    polls_until(end)
    now = max(now, end)
    listener.commit(now, policy.flush())
    return [cut for _, cut in listener.commits], listener


def llm(text: str, rate: float = 20.0, start: float = 0.0) -> list[tuple[float, str]]:
    """LLM-like tokens at a steady ``rate`` per second."""
    return [(start + i / rate, tok) for i, tok in enumerate(tokenize(text))]


def texts(cuts: list[Cut]) -> list[str]:
    return [c.text for c in cuts]


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


# --- table: text + arrival times + buffer -> segments -----------------------------------

LONG = (
    "Sure, I can help you plan a weekend trip to the mountains near the lake where"
    " the trails are quiet in autumn and the views reach across three valleys. Then"
)


def test_first_segment_after_min_words_of_a_steady_stream() -> None:
    cuts, _ = simulate(llm("I think the best approach here is simple. Then more"))
    assert texts(cuts)[0] == "I think the best"  # 4 words, not ending in "the"
    assert cuts[0].kind == "word"
    assert texts(cuts)[1:] == ["approach here is simple.", "Then more"]


def test_first_segment_at_a_clause_or_sentence_when_one_comes_first() -> None:
    assert texts(simulate(llm("Well, I think so. More"))[0])[:2] == ["Well,", "I think so."]
    assert texts(simulate(llm("Okay. I think so. More"))[0])[:2] == ["Okay.", "I think so."]


def test_first_word_cut_respects_the_configured_minimum() -> None:
    cuts, _ = simulate(
        llm("I would really like to go there today. X"),
        config=PolicyConfig(first_min_words=6),
    )
    assert texts(cuts)[0] == "I would really like to go"


def test_short_clause_then_long_sentence_gets_an_early_cut_before_running_dry() -> None:
    cuts, listener = simulate(llm(LONG))
    assert cuts[0].text == "Sure,"
    # the long sentence is cut once, where the buffer would run dry, then
    # the rest waits for the sentence end
    assert any(c.kind in SUB_CLAUSE_KINDS for c in cuts[1:3])
    assert cuts[-2].text.endswith("valleys.")
    # every commit came while the listener still had audio for its lead
    for (t, _), previous_end in zip(listener.commits[1:], _ends(listener), strict=False):
        assert t + CONFIG.lead_s <= previous_end + 1e-9


def _ends(listener: Listener) -> list[float]:
    """When each committed segment's audio ends, in the simulation."""
    ends: list[float] = []
    end = None
    for t, cut in listener.commits:
        start = max(t + CONFIG.lead_s, end if end is not None else t)
        end = start + estimate_seconds(cut.text, CONFIG.speed)
        ends.append(end)
    return ends


def test_no_early_cut_while_the_buffer_is_full() -> None:
    # ten seconds of an earlier utterance ahead: sentence ends only (and the
    # first clause, as auto always did)
    cuts, _ = simulate(llm(LONG), base_s=10.0)
    assert texts(cuts) == [
        "Sure,",
        LONG.removeprefix("Sure, ").removesuffix(" Then"),
        "Then",
    ]
    assert not any(c.kind in SUB_CLAUSE_KINDS for c in cuts)


def test_a_clause_is_preferred_to_a_word_when_it_comes_in_time() -> None:
    text = "Okay. Alpha beta gamma delta epsilon, zeta eta theta iota kappa and"
    cuts, listener = simulate([(0.0, text)], base_s=1.2, end_at=1.0)
    assert texts(cuts) == [
        "Okay.",
        "Alpha beta gamma delta epsilon,",
        "zeta eta theta iota kappa and",
    ]
    # at the clause tier (slack 0.8 s), not at the first word candidate
    assert listener.commits[1][0] == pytest.approx(1.2 + 0.3 - CONFIG.lead_s - 0.8)


def test_without_a_clause_in_time_a_word_cut_comes_first() -> None:
    text = "Sure, the first thing to know about hiking, which matters most, is water. X"
    cuts, _ = simulate(llm(text, rate=6.0))  # slow text: "Sure," runs out first
    assert texts(cuts)[:2] == ["Sure,", "the first thing to know"]
    assert cuts[1].kind == "word"


def test_text_sent_whole_then_flushed_is_never_cut_early() -> None:
    sentence = "The quick brown fox jumps over the lazy dog near the old river bank."
    cuts, _ = simulate([(0.0, sentence)], end_at=0.001)
    assert texts(cuts) == [sentence]
    paragraph = "Hello there, how are you doing today? I am fine thanks for asking."
    cuts, _ = simulate([(0.0, paragraph)], end_at=0.001)
    assert texts(cuts) == [
        "Hello there,",
        "how are you doing today?",
        "I am fine thanks for asking.",
    ]


def test_a_burst_reaches_its_sentence_end_before_a_word_cut() -> None:
    # word by word within a few milliseconds (a client sending a whole text)
    text = "The quick brown fox jumped over the lazy dog. It was a sunny day in the park."
    events = [(i * 0.001, w + " ") for i, w in enumerate(text.split(" "))]
    cuts, _ = simulate(events, end_at=0.05)
    assert texts(cuts) == [
        "The quick brown fox jumped over the lazy dog.",
        "It was a sunny day in the park.",
    ]
    # the same words stalling after the fourth: cut once the burst time is over
    stalled = [*events[:6], (1.0, "dog. ")]
    cuts, listener = simulate(stalled, end_at=1.0)
    assert texts(cuts)[0] == "The quick brown fox"
    assert listener.commits[0][0] == pytest.approx(CONFIG.burst_s)


@pytest.mark.parametrize(
    "text",
    [
        "We met Dr. Smith and Mr. Jones at the station early",
        "It costs 3.14 or 1,000 at 10:30 today and more later",
        "Visit https://example.com/a?b=1 or mail a.b@example.com for the details",
        "There were 3 000 people at the meeting in the morning",
    ],
)
def test_protected_tokens_are_never_split(text: str) -> None:
    cuts, _ = simulate(llm(text, rate=2.0))  # very slow text: cuts wherever allowed
    protected = ["Dr. Smith", "Mr. Jones", "3.14", "1,000", "10:30", "3 000"]
    protected += ["https://example.com/a?b=1", "a.b@example.com"]
    for cut in cuts[:-1]:
        assert not cut.text.endswith(("Dr.", "Mr.", " the", " and", " at", " or", " 3"))
    joined = " | ".join(texts(cuts))
    for token in protected:
        if token in text:
            assert token in joined, joined


def test_granularities_other_than_auto_are_untimed() -> None:
    for granularity, first in (("sentence", "Sure, I can"), ("clause", "Sure,")):
        cuts, _ = simulate(llm(LONG), granularity=granularity)
        assert cuts[0].text.startswith(first)
        assert not any(c.kind in SUB_CLAUSE_KINDS for c in cuts)


def test_untimed_auto_keeps_the_old_rules() -> None:
    policy = SegmentPolicy(Segmenter("auto"), timed=False)
    assert policy.push("I think the best approach", 0.0, 0.0) == []
    assert policy.next_check(0.0, 0.0) is None
    assert texts(policy.flush()) == ["I think the best approach"]


def test_counts_by_kind() -> None:
    policy = SegmentPolicy(Segmenter("auto"))
    cuts = policy.push("Well, one two three four five six", 0.0, 0.0)
    assert texts(cuts) == ["Well,"]  # 0.3 s of "Well," ahead: time to wait
    cuts += policy.poll(0.2, 0.4)  # 0.1 s of slack left: below the 0.2 s margin
    cuts += policy.flush()
    assert texts(cuts) == ["Well,", "one two three four", "five six"]
    assert [c.kind for c in cuts] == ["clause", "word", "other"]
    assert policy.counts == {"clause": 1, "word": 1, "other": 1}


def test_next_check_is_when_the_tier_is_reached() -> None:
    policy = SegmentPolicy(Segmenter("auto"), PolicyConfig(recheck_s=10.0))
    assert texts(policy.push("Okay. One two three four five six seven", 0.0, 5.0)) == ["Okay."]
    ahead = 5.0 + estimate_seconds("Okay.", CONFIG.speed)  # what the caller sees now
    at = policy.next_check(0.0, ahead)
    assert at == pytest.approx(ahead - CONFIG.lead_s - CONFIG.margin_s)
    assert policy.poll(at - 0.01, ahead - (at - 0.01)) == []
    assert texts(policy.poll(at, ahead - at)) == ["One two three four"]
    assert policy.next_check(at, 2.0) is None  # "five six" has too few words


@pytest.mark.parametrize(
    ("after", "expected", "left"),
    [
        # the next push cuts the held text with its own, as one increment
        ("push", ["First one.", "Second one."], "Third"),
        # so does a poll (the timer's check); the last sentence end waits
        # for more text, as when pushed
        ("poll", ["First one."], "Second one."),
        # a flush commits everything held
        ("flush", ["First one.", "Second one."], ""),
    ],
)
def test_held_text_is_cut_with_the_next_call(after: str, expected: list[str], left: str) -> None:
    held = "First one. Second one. "
    policy = SegmentPolicy(Segmenter("auto"))
    for word in held.split(" "):
        policy.hold(word + " " if word else "", 0.0)
    assert policy.holding and policy.buffered == held
    cuts = _then(policy, after)
    assert texts(cuts) == expected and not policy.holding
    assert policy.buffered.strip() == left
    # the same as pushing the held text in one go
    at_once = SegmentPolicy(Segmenter("auto"))
    assert texts(at_once.push(held, 0.0, 5.0) + _then(at_once, after)) == expected


def _then(policy: SegmentPolicy, after: str) -> list[Cut]:
    if after == "push":
        return policy.push("Third", 1.0, 5.0)
    return policy.poll(1.0, 0.0) if after == "poll" else policy.flush()


def test_held_text_is_discarded_with_the_rest() -> None:
    policy = SegmentPolicy(Segmenter("auto"))
    policy.push("Spoken words", 0.0, 5.0)
    policy.hold(" and held ones", 0.1)
    assert policy.discard() == "Spoken words and held ones"
    assert not policy.holding and policy.buffered == ""


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        PolicyConfig(first_min_words=0)
    with pytest.raises(ValueError):
        PolicyConfig(margin_s=1.0, phrase_slack_s=0.5)


# --- invariants ------------------------------------------------------------------------------

WORDS = st.sampled_from(
    [
        "I",
        "we",
        "the",
        "a",
        "and",
        "but",
        "which",
        "Dr.",
        "Mr.",
        "3.14",
        "1,000",
        "10:30",
        "x.com/a?b",
        "a@b.com",
        "U.S.",
        "hello",
        "world",
        "mountains",
        "river",
        "quickly",
        "because",
        "trail",
        "e.g.",
        "J.",
        "42",
    ]
)
PUNCT = st.sampled_from(["", "", "", ",", ".", "!", "?", ";", "..."])


@st.composite
def timed_text(draw: st.DrawFn) -> list[tuple[float, str]]:
    words = draw(st.lists(st.tuples(WORDS, PUNCT), min_size=1, max_size=40))
    text = " ".join(w + p for w, p in words)
    tokens = tokenize(text)
    gaps = draw(st.lists(st.floats(0.0, 0.6), min_size=len(tokens), max_size=len(tokens)))
    t = 0.0
    events = []
    for token, gap in zip(tokens, gaps, strict=True):
        t += gap
        events.append((round(t, 3), token))
    return events


def _split_same_time(
    events: list[tuple[float, str]], data: st.DataObject
) -> list[tuple[float, str]]:
    out: list[tuple[float, str]] = []
    for t, text in events:
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=3)))
        last = 0
        for c in cuts:
            if c < len(text):
                out.append((t, text[last:c]))
                last = c
        out.append((t, text[last:]))
    return out


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(events=timed_text(), data=st.data(), base=st.sampled_from([0.0, 0.5, 3.0]))
def test_no_text_lost_or_duplicated(
    events: list[tuple[float, str]], data: st.DataObject, base: float
) -> None:
    cuts, _ = simulate(events, base_s=base)
    assert squash("".join(c.text for c in cuts)) == squash("".join(t for _, t in events))
    assert all(c.text.strip() for c in cuts)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(events=timed_text(), data=st.data(), base=st.sampled_from([0.0, 0.5, 3.0]))
def test_same_segments_for_any_chunking_and_extra_polls(
    events: list[tuple[float, str]], data: st.DataObject, base: float
) -> None:
    reference, _ = simulate(events, base_s=base)
    split = _split_same_time(events, data)
    end = events[-1][0]
    polls = tuple(data.draw(st.lists(st.floats(0.0, end + 1.0), max_size=5)))
    again, _ = simulate(split, base_s=base, extra_polls=polls, end_at=end)
    assert texts(again) == texts(reference)
