"""Baselines and ranking variants of the answer-recall benchmark, over the same jobs.

A job is what the pipeline holds before ranking: the question, its pages (fetched and
extracted by webctx). Every system here sees the same pages and the same embeddings
(one endpoint, one cache); they differ only in how pages are cut and chunks chosen.
Scores that do not depend on the budget (cosine, BM25) are computed once per job and
chunking; only the packing runs once per budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from webctx.models import Chunk, Page, ScoredChunk
from webctx.protocols import Embedder
from webctx.stages.chunk import chunk_page
from webctx.stages.embed import embed_texts
from webctx.stages.rank import (
    DEDUP_THRESHOLD,
    PER_SOURCE_CAP,
    RRF_K,
    rank_chunks,
    ranks_by_score,
    rrf,
)
from webctx.stages.sparse import bm25_scores
from webctx.tokens import count_tokens


def embed_all(texts: Sequence[str], embedder: Embedder) -> list[list[float]]:
    """Vectors of `texts` in as few requests as the endpoint's caps allow."""
    return embed_texts(texts, embedder, max_inputs=256, max_tokens_per_request=100_000,
                       max_input_tokens=8000, max_attempts=3).vectors  # fmt: skip


def fixed_chunks(page: Page, size: int = 500) -> list[Chunk]:
    """Consecutive `size`-character slices of the page text (the naive baseline)."""
    text = page.text
    return [
        Chunk(
            content_sha256=page.content_sha256,
            index=i,
            start=start,
            end=min(start + size, len(text)),
            text=text[start : start + size],
            tokens=count_tokens(text[start : start + size]),
        )  # fmt: skip
        for i, start in enumerate(range(0, len(text), size))
    ]


Chunker = Callable[[Page], list[Chunk]]


@dataclass
class ChunkIndex:
    """Chunks of pages under one chunker, with their vectors (each page embedded once)."""

    chunker: Chunker
    embedder: Embedder
    title_prefix: bool = False
    chunks: dict[str, list[Chunk]] = field(default_factory=dict)
    vectors: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, pages: Sequence[Page]) -> None:
        """Chunk and embed the pages not seen yet, in one batch of requests."""
        new = list({p.content_sha256: p for p in pages if p.content_sha256 not in self.chunks}
                   .values())  # fmt: skip
        texts: list[str] = []
        for page in new:
            chunks = self.chunker(page)
            self.chunks[page.content_sha256] = chunks
            texts += [self.embed_input(page, c) for c in chunks]
        if not texts:
            return
        vectors: np.ndarray = np.asarray(embed_all(texts, self.embedder), dtype=np.float64)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        at = 0
        for page in new:
            n = len(self.chunks[page.content_sha256])
            self.vectors[page.content_sha256] = vectors[at : at + n]
            at += n

    def embed_input(self, page: Page, chunk: Chunk) -> str:
        """What is embedded for a chunk: its text, or the page title and its text."""
        return f"{page.title}\n{chunk.text}" if self.title_prefix and page.title else chunk.text

    def view(self, pages: Sequence[Page], question: str, qvec: np.ndarray) -> JobView:
        """A job's chunks under this chunker with their cosine and BM25 scores."""
        chunks: list[Chunk] = []
        urls: list[str] = []
        blocks = []
        for page in pages:
            chunks += self.chunks[page.content_sha256]
            urls += [page.url] * len(self.chunks[page.content_sha256])
            blocks.append(self.vectors[page.content_sha256])
        vectors = np.vstack(blocks) if blocks else np.zeros((0, qvec.shape[0]))
        dense = (vectors @ qvec).tolist()
        lexical = bm25_scores(question, [c.text for c in chunks])
        return JobView(question, chunks, urls, vectors, dense, lexical)


@dataclass
class JobView:
    """One job's chunks, their URLs, unit vectors, cosine and BM25 scores."""

    question: str
    chunks: list[Chunk]
    urls: list[str]
    vectors: np.ndarray
    dense: list[float]
    lexical: list[float]


def top_until_budget(chunks: Sequence[Chunk], scores: Sequence[float], budget: int) -> list[Chunk]:
    """Best-scored chunks while they fit the budget (one that does not fit is skipped)."""
    chosen: list[Chunk] = []
    left = budget
    for i in sorted(range(len(chunks)), key=lambda i: -scores[i]):
        if chunks[i].tokens <= left:
            chosen.append(chunks[i])
            left -= chunks[i].tokens
    return chosen


def dense_baseline(view: JobView, budget: int) -> list[Chunk]:
    """Baseline (a): cosine of question and chunk vectors, top chunks until the budget."""
    return top_until_budget(view.chunks, view.dense, budget)


def bm25_baseline(view: JobView, budget: int) -> list[Chunk]:
    """Baseline (b): BM25 of the question over the same chunks."""
    return top_until_budget(view.chunks, view.lexical, budget)


@dataclass(frozen=True)
class Ranking:
    """How a variant orders a job's chunks before webctx's packing (rank_chunks)."""

    fusion: bool = True  # RRF of cosine and BM25 ranks; else cosine alone
    rrf_k: int = RRF_K
    lexical_weight: float = 1.0  # weight of the BM25 list in the fusion (cosine: 1)
    combine: str = "sum"  # "sum": RRF; "max": the better of the two reciprocal ranks
    pool: int | None = None  # only the `pool` nearest by cosine are candidates (None: all)
    per_source_cap: int | None = PER_SOURCE_CAP
    dedup_threshold: float = DEDUP_THRESHOLD


def variant_select(view: JobView, budgets: Sequence[int], ranking: Ranking) -> list[list[Chunk]]:
    """A candidate ranking rule, packed by webctx's rank_chunks once per budget."""
    n = len(view.chunks)
    keep = sorted(range(n), key=lambda i: -view.dense[i])[: ranking.pool or n]
    cos = [view.dense[i] for i in keep]
    if ranking.fusion:
        # BM25 statistics come from the candidates, as in the pipeline (fuse_lexical).
        lexical = (
            view.lexical if ranking.pool is None
            else bm25_scores(view.question, [view.chunks[i].text for i in keep])
        )  # fmt: skip
        lexical = [lexical[i] for i in keep] if ranking.pool is None else lexical
        dense_ranks, lexical_ranks = ranks_by_score(cos), ranks_by_score(lexical)
        if ranking.combine == "max":
            alone = (rrf([dense_ranks], k=ranking.rrf_k),
                     rrf([lexical_ranks], k=ranking.rrf_k, weights=[ranking.lexical_weight]))
            scores = [max(alone[0][i], alone[1][i]) for i in range(len(cos))]
        else:
            fused = rrf([dense_ranks, lexical_ranks], k=ranking.rrf_k,
                        weights=[1.0, ranking.lexical_weight])  # fmt: skip
            scores = [fused[i] for i in range(len(cos))]
    else:
        scores = cos
    candidates = [
        # Unvalidated, with the numpy row as vector: rank_chunks only reads it as an array.
        ScoredChunk.model_construct(chunk=view.chunks[i], url=view.urls[i], score=s,
                                    vector=view.vectors[i])  # fmt: skip
        for i, s in zip(keep, scores, strict=True)
    ]
    return [
        [r.chunk for r in rank_chunks(candidates, top_k=200, token_budget=budget,
                                      per_source_cap=ranking.per_source_cap,
                                      dedup_threshold=ranking.dedup_threshold)]  # fmt: skip
        for budget in budgets
    ]


def token_chunker(max_tokens: int, overlap_tokens: int) -> Chunker:
    """webctx's chunk_page with the given sizes."""
    return lambda page: chunk_page(page, max_tokens=max_tokens, overlap_tokens=overlap_tokens)
