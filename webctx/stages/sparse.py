"""Sparse BM25-style vectors by the hashing trick, for the text half of hybrid index search.

A document vector holds, per distinct word, BM25's saturated term frequency
`tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))`; a query vector holds 1.0 per
distinct word. The engines multiply the two and apply IDF themselves (Qdrant's
`Modifier.IDF`, computed over the stored points), so the dot product is Okapi BM25.
Words map to dimensions by a stable hash (blake2b, 31 bits), so no vocabulary is kept
and every process, engine and run agrees on the indices.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
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
    """Qdrant's IDF: ln(1 + (N - n + 0.5) / (n + 0.5))."""
    return math.log(1 + (n_docs - doc_freq + 0.5) / (doc_freq + 0.5))


def rrf(rankings: Sequence[Sequence[str]], *, k: int = 60) -> list[tuple[str, float]]:
    """Reciprocal-rank fusion of ranked id lists: (id, sum of 1 / (k + rank)), best first."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])
