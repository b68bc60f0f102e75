"""How surely a bundle answers each facet of its question: signals on numbers, one
logistic model over them, and a status per facet.

The signals of a facet, over the chunks picked for it and the candidates they were picked
from (its pool):

- `dense`: the best cosine of a picked chunk to the facet (the question, for one facet);
- `gap`: that cosine above the mean of the pool's best `POOL_TOP` (an answer stands out
  of its page's other passages; a page merely on topic does not);
- `terms`: the largest share of the facet's content words one chunk holds, each word
  weighted by its rarity among the pool's best `POOL_TERMS` (a word every candidate holds
  says little);
- `typed`, `typed_hit`: whether the facet asks for an answer type (a date for "when", a
  number for "how many", a name for "who", a place for "where") and whether the
  best-covering chunk holds one the question does not already spell;
- `sources`: how many distinct sources hold a chunk covering most of those words.

`COEFFICIENTS` were fitted by bench/sufficiency.py (`--fit`) on one half of the QA
questions (split by page) and are reported on the other; their output is a probability
that the bundle holds the facet's answer.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from typing import Literal

from webctx.models import Coverage, FacetCoverage, ScoredChunk
from webctx.stages.sparse import words
from webctx.stages.words import STOPWORDS as _STOPWORDS

Status = Literal["supported", "weak", "missing"]
POOL_TOP = 20
POOL_TERMS = 200
"""Candidates (best first) word rarity is counted over: the passages a facet competes with."""
_STEM = 5
SUPPORTED = 0.6
"""Confidence at or above which a facet is supported."""
MISSING = 0.156
"""Confidence below which a facet is missing: no source found for it. Fitted with the
coefficients: on the fit half, 4 % of the bundles holding their answer fall below it at
the default token budget."""
FEATURES = ("dense", "gap", "terms", "typed", "typed_hit", "sources")
# bench/sufficiency.py --fit --questions 90 (1,080 facet-bundles: 4 budgets, 3 webs).
COEFFICIENTS = (9.2574, 3.7439, 5.3069, -0.9275, 0.5522, -0.1555)
INTERCEPT = -9.233


@dataclass(frozen=True)
class FacetSignals:
    """The numbers a facet's confidence is computed from (see the module docstring)."""

    dense: float
    gap: float
    terms: float
    typed: float
    typed_hit: float
    sources: float

    def vector(self) -> list[float]:
        """The signals in `FEATURES` order."""
        return list(astuple(self))


_YEAR = r"\b(?:1\d{3}|20\d{2})s?\b"
_MONTHS = (
    r"\b(?:january|february|march|april|may|june|july|august|september|october|november|"
    r"december|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec)\b"
)
_DATE = re.compile(rf"{_YEAR}|{_MONTHS}|\bcentur(?:y|ies)\b|\b\d{{1,2}}(?:st|nd|rd|th)\b", re.I)
_NUMBER = re.compile(
    r"\d|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|"
    r"forty|fifty|hundred|thousand|million|billion|dozen|half|several)\b",
    re.I,
)
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][\w'’-]+")
_ASKS = (
    (re.compile(r"\b(?:when|what year|which year|what date|what century|what decade|"
                r"how long ago|since when)\b", re.I), "date"),
    (re.compile(r"\bhow (?:many|much|long|old|far|large|big|tall|high|deep|wide|often)\b|"
                r"\bwhat (?:percentage|percent|number|amount|fraction|proportion)\b", re.I),
     "number"),
    (re.compile(r"\b(?:who|whom|whose)\b", re.I), "name"),
    (re.compile(r"\bwhere\b", re.I), "name"),
)  # fmt: skip
_PATTERNS = {"date": _DATE, "number": _NUMBER, "name": _NAME}


def _best(pool: Sequence[ScoredChunk], n: int) -> Sequence[ScoredChunk]:
    """The `n` best-scored candidates of a pool (all when it holds no more)."""
    if len(pool) <= n:
        return pool
    return sorted(pool, key=lambda c: -c.score)[:n]


def answer_type(question: str) -> str | None:
    """The type of answer `question` asks for: date, number, name, or None."""
    for pattern, kind in _ASKS:
        if pattern.search(question):
            return kind
    return None


def _stem(word: str) -> str:
    return word[:_STEM]


@functools.lru_cache(maxsize=8192)
def _content_terms(text: str) -> frozenset[str]:
    """A text's content words, stemmed (cached: a job's pool is read once per facet and
    budget, and the same chunks come back for every job on the same pages)."""
    return frozenset(_stem(w) for w in words(text) if w not in _STOPWORDS and len(w) > 1)


def _holds_type(kind: str, text: str, question: str) -> bool:
    """Whether `text` holds an answer of `kind` not already spelt in the question."""
    asked = {w.casefold() for w in re.findall(r"[\w'’-]+", question)}
    return any(m.group().casefold() not in asked for m in _PATTERNS[kind].finditer(text))


def facet_signals(
    facet: str, chunks: Sequence[ScoredChunk], pool: Sequence[ScoredChunk]
) -> FacetSignals:
    """The signals of one facet from the chunks picked for it and its candidate pool."""
    if not chunks:
        return FacetSignals(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    pool = _best(pool, POOL_TERMS) if pool else chunks
    terms = _content_terms(facet)
    pool_terms = [_content_terms(c.chunk.text) for c in pool]
    n = len(pool_terms)
    weight = {t: math.log((n + 1) / (sum(t in p for p in pool_terms) + 0.5)) for t in terms}
    total = sum(weight.values()) or 1.0
    covers = [sum(weight[t] for t in terms & _content_terms(c.chunk.text)) / total
              for c in chunks]  # fmt: skip
    dense = [c.dense if c.dense is not None else 0.0 for c in chunks]
    pool_dense = sorted((c.dense or 0.0 for c in pool), reverse=True)[:POOL_TOP]
    best_cover = max(range(len(chunks)), key=lambda i: (covers[i], dense[i]))
    kind = answer_type(facet)
    hit = kind is not None and _holds_type(kind, chunks[best_cover].chunk.text, facet)
    agreeing = {c.url for c, share in zip(chunks, covers, strict=True) if share >= 0.5}
    return FacetSignals(
        dense=max(dense),
        gap=max(dense) - sum(pool_dense) / len(pool_dense),
        terms=covers[best_cover],
        typed=float(kind is not None),
        typed_hit=float(hit),
        sources=math.log1p(len(agreeing)),
    )


def confidence_of(signals: FacetSignals) -> float:
    """The fitted probability that the facet's answer is among its chunks."""
    z = INTERCEPT + sum(w * x for w, x in zip(COEFFICIENTS, signals.vector(), strict=True))
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def status_of(confidence: float) -> Status:
    """supported, weak or missing, by the shipped thresholds."""
    if confidence >= SUPPORTED:
        return "supported"
    return "weak" if confidence >= MISSING else "missing"


def assess_coverage(
    facets: Sequence[str],
    chunks: Sequence[ScoredChunk],
    *,
    facet_of: Sequence[int] | None = None,
    pools: Sequence[Sequence[ScoredChunk]] | None = None,
    confidences: Sequence[float] | None = None,
) -> Coverage:
    """The coverage of a bundle: `chunks` in the bundle's order, `facet_of[i]` the facet
    chunk i was picked for (all the first by default), `pools[f]` facet f's candidates
    (default: its chunks), `confidences` each facet's when already computed.
    `sufficient` is False when any facet is missing; `confidence`
    is the product of the facets' (each needs its own answer)."""
    facet_of = [0] * len(chunks) if facet_of is None else list(facet_of)
    if len(facet_of) != len(chunks):
        raise ValueError("one facet index per chunk")
    out: list[FacetCoverage] = []
    for f, text in enumerate(facets):
        mine = [i for i, of in enumerate(facet_of) if of == f]
        picked = [chunks[i] for i in mine]
        if confidences is not None:
            p = confidences[f]
        elif picked:
            pool = pools[f] if pools is not None else picked
            p = confidence_of(facet_signals(text, picked, pool))
        else:
            p = 0.0
        p = round(p, 4)
        out.append(FacetCoverage(text=text, status=status_of(p), confidence=p, chunks=mine))
    overall = math.prod(f.confidence for f in out) if out else 0.0
    return Coverage(
        sufficient=bool(out) and all(f.status != "missing" for f in out),
        confidence=round(overall, 4),
        facets=out,
        notes=[missing_note(f.text) for f in out if f.status == "missing"],
    )


def missing_note(facet: str) -> str:
    """The words every surface gives a facet nothing supports."""
    return f"No source found for: {' '.join(facet.split())}"
