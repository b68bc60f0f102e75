"""Select the chunks of a bundle: best first, de-duplicated, diverse, within a token budget.

Selection is one greedy loop over candidates in score order. A candidate is refused when it
repeats a selected chunk (same normalised text, or near-identical vector: the same text on
several sites counts once), overlaps a selected chunk of the same page (overlap windows), or
would push the token sum past the budget. There is no per-source cap by default: with one
(3 or 8), a source's further chunks were deferred until every other candidate had been
tried, so the page holding the answer lost its 4th passage to other pages' weakest chunks
(bench/answer_recall.py, docs/benchmarks.md). A cap, when given, still works that way.

Scores are cosine similarities, or, after `fuse_lexical`, reciprocal-rank fusions of cosine
and BM25 ranks (what `answer_question` passes in). `rrf` is webctx's one reciprocal-rank
fusion: the index's hybrid search fuses its dense and sparse rankings with it too.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from webctx.models import ScoredChunk
from webctx.stages.sparse import TermCounts, bm25_scores

_Vector = npt.NDArray[np.float64]
T = TypeVar("T", bound=Hashable)
RRF_K = 30
"""Reciprocal-rank-fusion constant (Cormack et al. 2009): rank r adds 1 / (RRF_K + r).
30, not the paper's 60: at least as good at every budget on both seeds of
bench/answer_recall.py, and better at 250 and 500 tokens (docs/benchmarks.md)."""
PER_SOURCE_CAP: int | None = None
"""Chunks per source before other sources' chunks go first (None: no cap)."""
DEDUP_THRESHOLD = 0.95
"""Cosine of two chunk vectors at or above which the lower-scored one is a duplicate."""


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors; 0.0 when either is zero or their sizes differ."""
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if va.shape != vb.shape or va.size == 0:
        return 0.0
    norms = float(np.linalg.norm(va) * np.linalg.norm(vb))
    return float(va @ vb) / norms if norms > 0.0 else 0.0


def rrf(
    rankings: Sequence[Mapping[T, int]], *, k: int, weights: Sequence[float] | None = None
) -> dict[T, float]:
    """Reciprocal rank fusion (Cormack et al. 2009): each item's sum, over the rankings that
    place it, of weight / (k + rank), rank 1 being the best. Items come in the order they
    are first met (first ranking first), which breaks ties of a stable sort by score."""
    weights = [1.0] * len(rankings) if weights is None else weights
    if len(weights) != len(rankings):
        raise ValueError("one weight per ranking")
    fused: dict[T, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for item, rank in ranking.items():
            fused[item] = fused.get(item, 0.0) + weight / (k + rank)
    return fused


def ranks_in_order(items: Sequence[T]) -> dict[T, int]:
    """item -> its 1-based place in a best-first list."""
    return {item: rank for rank, item in enumerate(items, start=1)}


def ranks_by_score(scores: Sequence[float]) -> dict[int, int]:
    """position -> its 1-based rank by score, higher first; equal scores share the better
    rank."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    ranks: dict[int, int] = {}
    rank = 0
    for place, i in enumerate(order):
        if place == 0 or scores[i] != scores[order[place - 1]]:
            rank = place + 1
        ranks[i] = rank
    return ranks


def fuse_lexical(
    question: str,
    candidates: Sequence[ScoredChunk],
    *,
    k: int = RRF_K,
    urls: Mapping[str, str] | None = None,
    counted: Mapping[str, TermCounts] | None = None,
) -> list[ScoredChunk]:
    """Candidates re-scored by reciprocal rank fusion of their cosine and the question's BM25;
    with `urls` (content hash -> URL), each also cites its page's URL there (in the same
    copy: rank copies thousands of candidates). `counted`: the candidates' BM25 term
    counts counted earlier, by text (`bm25_scores`).

    BM25 is computed over the candidates themselves, so the job's chunks should all be
    candidates. Dense retrieval alone misses exact names and numbers the question spells
    out; BM25 alone misses paraphrase (bench/answer_recall.py).
    """
    lexical = bm25_scores(question, [c.chunk.text for c in candidates], counted=counted)
    fused = rrf([ranks_by_score([c.score for c in candidates]), ranks_by_score(lexical)], k=k)
    out = []
    for i, c in enumerate(candidates):
        update: dict[str, object] = {"score": fused[i], "dense": c.score}
        if urls is not None:
            update["url"] = urls[c.chunk.content_sha256]
        out.append(c.model_copy(update=update))  # no re-validation
    return out


VectorLookup = Callable[[Sequence[ScoredChunk]], Sequence[Sequence[float]]]
"""The stored vectors of candidates searched without them, in order ([] when gone)."""
VECTOR_WINDOW = 64
"""Candidates whose vectors one lookup fetches, from the first one the picker needs."""


def rank_chunks(
    candidates: Sequence[ScoredChunk],
    *,
    top_k: int,
    token_budget: int,
    per_source_cap: int | None = PER_SOURCE_CAP,
    dedup_threshold: float = DEDUP_THRESHOLD,
    vectors: VectorLookup | None = None,
) -> list[ScoredChunk]:
    """Best distinct chunks by score, at most `top_k`, whose tokens sum within `token_budget`.

    `per_source_cap` None: no cap, score order alone decides. `vectors`: how to get the
    vectors of candidates that came without one, for the near-duplicate check; only those
    the picker reaches are fetched (a job's ~1,000 candidates' vectors cost twice its
    search, and the picker looks at a few dozen)."""
    if per_source_cap is not None and per_source_cap < 1:
        raise ValueError("per_source_cap must be at least 1")
    picker = _Picker(top_k=top_k, token_budget=token_budget, dedup_threshold=dedup_threshold)
    ordered = _by_score(candidates)
    vector_of = _Vectors(ordered, vectors)
    per_source: Counter[str] = Counter()
    deferred: list[int] = []
    for i, candidate in enumerate(ordered):
        if picker.full():
            break
        if per_source_cap is not None and per_source[candidate.url] >= per_source_cap:
            deferred.append(i)
        elif picker.offer(candidate, functools.partial(vector_of, i)):
            per_source[candidate.url] += 1
    # Relax the cap only now: one source's extra chunks beat an emptier bundle.
    for i in deferred:
        if picker.full():
            break
        picker.offer(ordered[i], functools.partial(vector_of, i))
    return _by_score(picker.selected)


class _Vectors:
    """Vectors of score-ordered candidates by position; those that came without one are
    looked up in windows of VECTOR_WINDOW, from the first position asked for."""

    def __init__(self, ordered: Sequence[ScoredChunk], lookup: VectorLookup | None) -> None:
        self._ordered = ordered
        self._lookup = lookup
        self._found: dict[int, Sequence[float]] = {}

    def __call__(self, i: int) -> Sequence[float]:
        vector = self._ordered[i].vector  # a list, or an array from model_construct callers
        if len(vector) or self._lookup is None:
            return vector
        if i not in self._found:
            window = [j for j in range(i, min(i + VECTOR_WINDOW, len(self._ordered)))
                      if j not in self._found and not len(self._ordered[j].vector)]  # fmt: skip
            got = self._lookup([self._ordered[j] for j in window])
            self._found.update(zip(window, got, strict=True))
        return self._found[i]


def _by_score(chunks: Sequence[ScoredChunk]) -> list[ScoredChunk]:
    """Best first; ties broken by page and position so the order is deterministic."""

    def key(c: ScoredChunk) -> tuple[float, str, int]:
        score = -math.inf if math.isnan(c.score) else c.score
        return (-score, c.chunk.content_sha256, c.chunk.start)

    return sorted(chunks, key=key)


def _normalise(text: str) -> str:
    """Case- and whitespace-insensitive form of a chunk's text for exact-duplicate checks."""
    return " ".join(text.casefold().split())


class _Picker:
    """The selected set and the rules a newcomer must pass to join it."""

    def __init__(self, *, top_k: int, token_budget: int, dedup_threshold: float) -> None:
        self.top_k = top_k
        self.budget_left = token_budget
        self.dedup_threshold = dedup_threshold
        self.selected: list[ScoredChunk] = []
        self._texts: set[str] = set()
        self._spans: dict[str, list[tuple[int, int]]] = {}
        self._unit_vectors: list[_Vector] = []

    def full(self) -> bool:
        """True when no further chunk can be taken."""
        return len(self.selected) >= self.top_k or self.budget_left <= 0

    def offer(self, candidate: ScoredChunk, vector: Callable[[], Sequence[float]]) -> bool:
        """Take `candidate` (whose vector `vector()` gives) if it fits and repeats nothing
        selected; report whether it was."""
        chunk = candidate.chunk
        if self.full() or chunk.tokens > self.budget_left:
            return False
        text = _normalise(chunk.text)
        if text in self._texts or self._overlaps(chunk.content_sha256, chunk.start, chunk.end):
            return False
        unit = _unit(vector())  # the costly check last
        if self._near_duplicate(unit):
            return False
        self.selected.append(candidate)
        self.budget_left -= chunk.tokens
        self._texts.add(text)
        self._spans.setdefault(chunk.content_sha256, []).append((chunk.start, chunk.end))
        if unit is not None:
            self._unit_vectors.append(unit)
        return True

    def _overlaps(self, page: str, start: int, end: int) -> bool:
        return any(start < e and s < end for s, e in self._spans.get(page, ()))

    def _near_duplicate(self, unit: _Vector | None) -> bool:
        if unit is None:
            return False
        return any(
            v.shape == unit.shape and float(v @ unit) >= self.dedup_threshold
            for v in self._unit_vectors
        )


def _unit(vector: Sequence[float]) -> _Vector | None:
    """`vector` scaled to length 1, or None when it is empty or zero."""
    v = np.asarray(vector, dtype=np.float64)
    norm = float(np.linalg.norm(v)) if v.size else 0.0
    return v / norm if norm > 0.0 else None
