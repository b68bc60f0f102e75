"""The words of a question: tokens, stopwords and content words (what the planner and the
facet rules read)."""

from __future__ import annotations

import re

# Keeps "C++", "Node.js", "GPT-4", "3.12", "I/O", "O'Reilly" whole; trailing punctuation is dropped.
TOKEN = re.compile(r"[\w][\w.+#'’/-]*[\w+#]|[\w]", re.UNICODE)
QUESTION_WORDS = frozenset(
    "what whats which who whom whose when where why how is are was were does do did can could "
    "should would will shall may might must explain describe tell show give list compare "
    "please know".split()
)
STOPWORDS = QUESTION_WORDS | frozenset(
    "a an the and or but if then than so of in on at to for from by with about into over under "
    "between through during before after above below up down out off again further once here "
    "there all any both each few more most other some such no nor not only own same too very "
    "just also i me my we our you your he him his she her it its they them their this that "
    "these those am be been being have has had having there's it's i'm there best way ways "
    "difference differences vs versus use used using get make work works".split()
)


def keywords(text: str) -> list[str]:
    """Content words in order, stopwords and question words removed, de-duplicated."""
    seen: set[str] = set()
    out: list[str] = []
    for token in TOKEN.findall(text):
        key = token.casefold()
        if key not in STOPWORDS and key not in seen:
            seen.add(key)
            out.append(token)
    return out
