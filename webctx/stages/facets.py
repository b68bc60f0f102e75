"""Split a question into the parts an answer needs (facets), by rules.

Three shapes split: several questions asked at once ("Q1? Q2?"), comparisons ("A vs B on
X", "compare A and B", "the difference between A and B") and lists of three or more items
("X, Y and Z"). Anything else, and any split whose parts would carry fewer than two content
words, stays one facet: the question itself.
"""

from __future__ import annotations

import re

from webctx.stages.words import STOPWORDS as _STOPWORDS
from webctx.stages.words import TOKEN as _TOKEN
from webctx.stages.words import keywords as _keywords

_MIN_CONTENT_WORDS = 2
_MAX_ITEM_WORDS = 4
_MAX_FACETS = 6
# Another question starts after a question mark (a closing quote may follow it), and at a
# capitalised question word mid-sentence ("What is X What was Y").
_QUESTION_END = re.compile(
    r"(?<=\?)\s+(?=\S)|(?<=\?[\"”’'])\s+(?=\S)"
    r"|(?<=[\w)\"”’'.!])\s+(?=(?:What|Who|Whom|Whose|When|Where|Which|Why|How|Name)\b)"
)
_AUXILIARIES = frozenset(
    "is are was were do does did can could should would will has have had may might must "
    "kind kinds type types sort sorts".split()
)
_VERSUS = re.compile(r"\s+(?:vs\.?|versus|v\.)\s+", re.I)
_COMPARE = re.compile(
    r"\b(?:compare|comparing|comparison of|differences? between|distinguish)\s+(?P<a>.+?)\s+"
    r"(?:and|with|to|vs\.?|versus)\s+(?P<b>.+)$",
    re.I,
)
_WORD = r"[\w][\w.+#'’/-]*"
_ITEM = rf"{_WORD}(?:\s+{_WORD}){{0,{_MAX_ITEM_WORDS - 1}}}"
# "X, Y and Z" / "X, Y, or Z": two items or more before the last one.
_LIST = re.compile(rf"{_ITEM}(?:,\s+{_ITEM})+,?\s+(?:and|or)\s+{_ITEM}", re.I)
_ONE_ANSWER = re.compile(
    r"\b(?:which|what) (?:one )?of\b|\bamong\b|\bbetween\b|\b(?:along with|besides|other than|"
    r"apart from|except)\b",
    re.I,
)
_COMPARE_WORDS = frozenset(
    "compare comparing comparison difference differences distinguish between vs versus v "
    "better worse faster slower".split()
)


def split_facets(question: str) -> list[str]:
    """The question's facets, in the order asked; a one-facet question gives `[question]`."""
    question = " ".join(question.split())
    if not question:
        return [question]
    facets: list[str] = []
    for part in _questions(question):
        facets.extend(_comparison(part) or _listed(part) or [part])
    facets = _distinct(facets)
    if len(facets) < 2 or len(facets) > _MAX_FACETS:
        return [question]
    return facets


def _content_words(text: str) -> int:
    return len(_keywords(text))


def _questions(question: str) -> list[str]:
    """The separate questions of `question`; a part too short to stand alone ("Why?") joins
    the one before it."""
    parts: list[str] = []
    for piece in _QUESTION_END.split(question):
        if parts and _content_words(piece) < _MIN_CONTENT_WORDS:
            parts[-1] = f"{parts[-1]} {piece}"
        elif parts and _content_words(parts[-1]) < _MIN_CONTENT_WORDS:
            parts[-1] = f"{parts[-1]} {piece}"
        else:
            parts.append(piece)
    return parts


def _item(text: str, *, from_end: bool) -> str:
    """The entity-like run of words next to a comparison marker: words up to a stopword,
    at most `_MAX_ITEM_WORDS`, an article next to it kept out."""
    tokens = text.split()
    if from_end:
        tokens = tokens[::-1]
    run: list[str] = []
    for token in tokens:
        bare = token.strip(",;:?.!()\"'").casefold()
        if not bare or bare in _STOPWORDS or len(run) >= _MAX_ITEM_WORDS:
            if run or bare not in ("the", "a", "an"):
                break
            continue
        run.append(token.strip(",;:?.!()\"'"))
        if token[-1:] in ",;:?.!" and run:  # punctuation ends the item
            break
    return " ".join(run[::-1] if from_end else run)


def _like(item: str, other: str) -> str:
    """`item` cut before its first lower-case word when `other` is a name (capitals or
    digits in it): in "PostgreSQL and MySQL replication" the item is MySQL, replication
    what is compared."""
    words = item.split()
    if not any(c.isupper() or c.isdigit() for c in other) or not words:
        return item
    for n, word in enumerate(words[1:], start=1):
        if word.islower():
            return " ".join(words[:n])
    return item


def _aspect(text: str, items: list[str]) -> str:
    """What the comparison is about: the question's content words that are neither the
    items nor comparison words."""
    inside = {w.casefold() for item in items for w in _TOKEN.findall(item)}
    words = [
        w
        for w in _keywords(text)
        if w.casefold() not in inside and w.casefold() not in _COMPARE_WORDS
    ]
    return " ".join(words)


def _comparison(part: str) -> list[str]:
    """One facet per compared item ("Redis persistence", "Memcached persistence"), or []."""
    match = _VERSUS.search(part)
    if match:
        items = [_item(part[: match.start()], from_end=True),
                 _item(part[match.end() :], from_end=False)]  # fmt: skip
    elif compare := _COMPARE.search(part):
        items = [_item(compare.group("a"), from_end=False),
                 _item(compare.group("b"), from_end=False)]  # fmt: skip
    else:
        return []
    items[1] = _like(items[1], items[0])
    if not all(items) or items[0].casefold() == items[1].casefold():
        return []
    aspect = _aspect(part, items)
    return [f"{item} {aspect}".strip() for item in items]


def _listed(part: str) -> list[str]:
    """One facet per item of a list of three or more ("X, Y and Z"), the question around
    it kept, or []; not when the question asks to pick one of them."""
    match = _LIST.search(part)
    if match is None or _ONE_ANSWER.search(part) or _asks_for_one(part):
        return []
    raw = re.split(r",\s+(?:and\s+|or\s+)?|,?\s+(?:and|or)\s+", match.group())
    if len(raw) < 3:
        return []
    middle = [r.strip() for r in raw[1:-1]]
    if any(w.casefold() in _STOPWORDS for m in middle for w in m.split()):
        return []  # "of 1998, with its 2003 and 2009 revisions" is no list
    longest = max(len(m.split()) for m in middle)
    # "install Python, pip and venv": the first item is Python, as long as the others.
    first = " ".join(_item(raw[0], from_end=True).split()[-longest:])
    last = _like(" ".join(_item(raw[-1], from_end=False).split()[:longest]), middle[-1])
    if not first or not last:
        return []
    start = match.start() + raw[0].rfind(first)
    end = match.end() - len(raw[-1]) + raw[-1].find(last) + len(last)
    items = [first, *middle, last]
    before, after = part[:start], part[end:]
    return [f"{before}{item}{after}".strip() for item in items]


def _asks_for_one(part: str) -> bool:
    """Whether the question asks for one thing by its noun ("Which theatre…", "What species
    shows…"): a list in it describes that thing, not several things to answer."""
    tokens = part.split()
    if len(tokens) < 2 or tokens[0].casefold() not in ("which", "what"):
        return False
    return tokens[1].casefold().strip(",;:?") not in _AUXILIARIES


def _distinct(facets: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for facet in facets:
        key = facet.casefold()
        if key not in seen and _content_words(facet) >= 1:
            seen.add(key)
            out.append(facet)
    return out
