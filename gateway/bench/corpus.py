"""The benchmark's text: assistant-style replies written for this repository
(released with it under Apache-2.0), so every run speaks the same words.

``SENTENCES`` feed the ``flush`` scenario (one sentence per utterance);
``PARAGRAPHS`` feed ``llm``, ``barge-in`` and ``capacity`` (one reply per
utterance, streamed as tokens).  A run picks from them with a seeded
``random.Random``; see ``gateway.bench.runner``.
"""

from __future__ import annotations

import json
from pathlib import Path

#: replies in Markdown with emoji, each with its hand-written spoken form
#: (issue 21's corpus), relative to a checkout's root, where the harness
#: runs (like its ``--out``)
MARKDOWN_CORPUS = Path("bench") / "text_corpus" / "markdown.jsonl"

PARAGRAPHS: tuple[str, ...] = (
    "Sure, I can help with that. The train to the airport leaves every fifteen minutes"
    " from platform four. If you hurry, you should make the next one at ten past nine.",
    "Good question. Most houseplants prefer bright, indirect light and a little water"
    " once a week. Check the soil with your finger first, and water only when the top"
    " inch feels dry.",
    "Here is what I found. The library opens at eight in the morning on weekdays and at"
    " ten on Saturdays. It is closed on Sundays, but the returns box outside is always open.",
    "Let me walk you through it. First, unplug the router and wait for about thirty"
    " seconds. Then plug it back in, and give the lights a minute or two to settle.",
    "That sounds frustrating. I have moved your appointment to Thursday at half past"
    " two, with the same doctor. You will get a text message to confirm it shortly.",
    "Absolutely. To make a simple tomato sauce, warm some olive oil, add a clove of"
    " garlic, and pour in a can of crushed tomatoes. Let it simmer for twenty minutes,"
    " then season it with salt and a few leaves of basil.",
    "Happy to explain. A leap year adds one day to February, so the calendar keeps"
    " pace with the seasons. Without it, the summer months would slowly drift into"
    " autumn over the centuries.",
    "Of course. Your order left the warehouse this morning and is on its way. The"
    " courier expects to deliver it tomorrow between noon and four in the afternoon.",
    "I checked the forecast for you. It will be cloudy in the morning with a chance of"
    " light rain around lunchtime. The afternoon should clear up, with a high of"
    " eighteen degrees.",
    "No problem at all. I have cancelled the subscription, and you will not be charged"
    " again. You can still use the service until the end of the current month.",
    "Great choice. The museum has a guided tour every hour, starting at the main"
    " entrance. It lasts about forty minutes and covers the three most popular galleries.",
    "Let me think about that. The quickest way across town at this hour is the river"
    " path by bicycle. It takes around twenty minutes, and you avoid all of the traffic"
    " on the bridge.",
)

SENTENCES: tuple[str, ...] = tuple(
    sentence.strip() + "."
    for paragraph in PARAGRAPHS
    for sentence in paragraph.split(". ")
    if sentence.strip()
    for sentence in [sentence.rstrip(".")]
)

#: A long reply for barge-in: it is still speaking when the cancel comes.
LONG_REPLY = " ".join(PARAGRAPHS[:3])


def markdown_replies(path: Path = MARKDOWN_CORPUS) -> tuple[str, ...]:
    """The Markdown replies (``--corpus markdown``): read from the
    repository's corpus file, which a wheel does not ship."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SystemExit(
            f"--corpus markdown needs {path} (run from a checkout of the repository): {exc}"
        ) from None
    return tuple(json.loads(line)["text"] for line in lines if line.strip())
