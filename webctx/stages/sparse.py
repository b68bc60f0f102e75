"""BM25, the text half of hybrid retrieval, in the two forms webctx uses.

- `bm25_scores`: Okapi BM25 of a few texts for a query, document frequencies taken over
  those texts (rank fuses it with cosine over a job's candidates).
- Sparse vectors by the hashing trick (the index's stores): a document vector holds, per
  distinct word, BM25's saturated term frequency
  `tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))`; a query vector holds 1.0 per
  distinct word. The engines multiply the two and apply IDF themselves (Qdrant's
  `Modifier.IDF`, computed over the stored points), so the dot product is Okapi BM25.
  Words map to dimensions by a stable hash (blake2b, 31 bits), so no vocabulary is kept
  and every process, engine and run agrees on the indices.

The rankings of both halves are fused by `webctx.stages.rank.rrf`.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

_WORD = re.compile(r"\w+", re.UNICODE)
DIMENSIONS = 1 << 31
K1 = 1.2
B = 0.75
AVG_LEN = 256.0
"""Assumed mean words per chunk (chunks are ~256 tokens); only shapes length normalisation."""


@dataclass(frozen=True)
class SparseVector:
    """Sorted non-zero dimensions and their values."""

    indices: list[int]
    values: list[float]


def words(text: str) -> list[str]:
    """Lower-cased word tokens of `text`."""
    return [w.lower() for w in _WORD.findall(text)]


def term_index(word: str) -> int:
    """The dimension of one word."""
    digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % DIMENSIONS


def _from_weights(weights: Mapping[int, float]) -> SparseVector:
    ordered = sorted(weights.items())
    return SparseVector([i for i, _ in ordered], [v for _, v in ordered])


def document_vector(text: str) -> SparseVector:
    """BM25-saturated term frequencies of a chunk's words."""
    tokens = words(text)
    counts = Counter(term_index(w) for w in tokens)
    norm = K1 * (1 - B + B * len(tokens) / AVG_LEN)
    return _from_weights({i: tf * (K1 + 1) / (tf + norm) for i, tf in counts.items()})


def query_vector(text: str) -> SparseVector:
    """1.0 per distinct word of a query."""
    return _from_weights(dict.fromkeys((term_index(w) for w in words(text)), 1.0))


def idf(n_docs: int, doc_freq: int) -> float:
    """BM25's (and Qdrant's) IDF: ln(1 + (N - n + 0.5) / (n + 0.5))."""
    return math.log(1 + (n_docs - doc_freq + 0.5) / (doc_freq + 0.5))


TermCounts = tuple[int, dict[str, int]]
"""A text's number of words and how often each of a query's terms occurs in it (those that
do): what BM25 reads of a text."""


def query_terms(query: str) -> frozenset[str]:
    """The distinct lower-cased words of a query: the terms BM25 counts."""
    return frozenset(_WORD.findall(query.lower()))


def term_counts(text: str, terms: Collection[str]) -> TermCounts:
    """The words of `text` and its counts of `terms` (from `query_terms`)."""
    # Lower-cased before splitting (one call per text, not per word: a third of the time of
    # ranking a job's candidates went to per-word lower()), and only the query's terms
    # counted, each by a list scan in C (a Counter of every word took half as long again).
    found = _WORD.findall(text.lower())
    return len(found), {term: count for term in terms if (count := found.count(term))}


def bm25_scores(
    query: str,
    texts: Sequence[str],
    *,
    k1: float = K1,
    b: float = B,
    counted: Mapping[str, TermCounts] | None = None,
) -> list[float]:
    """Okapi BM25 of each text for `query`, document frequencies taken over `texts`.
    `counted`: texts' `term_counts` for this query's terms, counted earlier (a job's chunks
    as its pages were embedded); the others are counted here. Counting is nearly all of
    the time: ~35 us a 256-token chunk, ~90 ms for a 20-source job's candidates."""
    if not texts:
        return []
    terms = query_terms(query)
    known = counted or {}
    docs: list[dict[str, int]] = []
    lengths: list[int] = []
    for text in texts:
        length, doc = known.get(text) or term_counts(text, terms)
        lengths.append(length)
        docs.append(doc)
    avg = sum(lengths) / len(docs) or 1.0
    n = len(docs)
    weights = {term: idf(n, sum(1 for d in docs if term in d)) for term in terms}
    scores = []
    for doc, length in zip(docs, lengths, strict=True):
        norm = k1 * (1 - b + b * length / avg)
        scores.append(sum(weights[t] * tf * (k1 + 1) / (tf + norm) for t, tf in doc.items()))
    return scores
