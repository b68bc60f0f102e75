"""Baselines and ranking variants of the answer-recall benchmark, over the same jobs.

A job is what the pipeline holds before ranking: the question, its pages (fetched and
extracted by webctx). Every system here sees the same pages and the same embeddings
(one endpoint, one cache); they differ only in how pages are cut and chunks chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from webctx.models import Chunk, Page, ScoredChunk
from webctx.ports import Embedder
from webctx.stages.chunk import chunk_page
from webctx.stages.embed import embed_texts
from webctx.stages.rank import bm25_scores, fuse_ranks, rank_chunks
from webctx.tokens import count_tokens

EMBED_CAPS = {"max_inputs": 256, "max_tokens_per_request": 100_000, "max_input_tokens": 8000,
              "max_attempts": 3}  # fmt: skip


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
        new = [p for p in pages if p.content_sha256 not in self.chunks]
        texts: list[str] = []
        for page in new:
            chunks = self.chunker(page)
            self.chunks[page.content_sha256] = chunks
            texts += [self.embed_input(page, c) for c in chunks]
        if not texts:
            return
        vectors = np.asarray(embed_texts(texts, self.embedder, **EMBED_CAPS).vectors)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        at = 0
        for page in new:
            n = len(self.chunks[page.content_sha256])
            self.vectors[page.content_sha256] = vectors[at : at + n]
            at += n

    def embed_input(self, page: Page, chunk: Chunk) -> str:
        """What is embedded for a chunk: its text, or the page title and its text."""
        return f"{page.title}\n{chunk.text}" if self.title_prefix and page.title else chunk.text

    def job_chunks(self, pages: Sequence[Page]) -> tuple[list[Chunk], list[str], np.ndarray]:
        """All chunks of a job's pages, each chunk's URL, and their unit vectors."""
        chunks: list[Chunk] = []
        urls: list[str] = []
        blocks = []
        for page in pages:
            chunks += self.chunks[page.content_sha256]
            urls += [page.url] * len(self.chunks[page.content_sha256])
            blocks.append(self.vectors[page.content_sha256])
        return chunks, urls, np.vstack(blocks) if blocks else np.zeros((0, 1))


def top_until_budget(chunks: Sequence[Chunk], scores: Sequence[float], budget: int) -> list[Chunk]:
    """Best-scored chunks while they fit the budget (one that does not fit is skipped)."""
    chosen: list[Chunk] = []
    left = budget
    for i in sorted(range(len(chunks)), key=lambda i: -scores[i]):
        if chunks[i].tokens <= left:
            chosen.append(chunks[i])
            left -= chunks[i].tokens
    return chosen


def dense_baseline(
    index: ChunkIndex, pages: Sequence[Page], qvec: np.ndarray, budget: int
) -> list[Chunk]:
    """Baseline (a): cosine of question and chunk vectors, top chunks until the budget."""
    chunks, _, vectors = index.job_chunks(pages)
    return top_until_budget(chunks, (vectors @ qvec).tolist(), budget)


def bm25_baseline(
    index: ChunkIndex, pages: Sequence[Page], question: str, budget: int
) -> list[Chunk]:
    """Baseline (b): BM25 of the question over the same chunks."""
    chunks, _, _ = index.job_chunks(pages)
    return top_until_budget(chunks, bm25_scores(question, [c.text for c in chunks]), budget)


@dataclass(frozen=True)
class Ranking:
    """How a variant orders a job's chunks before webctx's packing (rank_chunks)."""

    fusion: bool = True  # RRF of cosine and BM25 ranks; else cosine alone
    rrf_k: int = 60
    pool: int | None = None  # only the `pool` nearest by cosine are candidates (None: all)
    per_source_cap: int = 3


def variant_select(
    index: ChunkIndex,
    pages: Sequence[Page],
    question: str,
    qvec: np.ndarray,
    budgets: Sequence[int],
    ranking: Ranking,
) -> list[list[Chunk]]:
    """A candidate ranking rule, packed by webctx's rank_chunks (dedup, overlap, cap),
    once per budget."""
    chunks, urls, vectors = index.job_chunks(pages)
    dense = (vectors @ qvec).tolist()
    keep = sorted(range(len(chunks)), key=lambda i: -dense[i])[: ranking.pool or len(chunks)]
    texts = [chunks[i].text for i in keep]
    cos = [dense[i] for i in keep]
    scores = (
        fuse_ranks([cos, bm25_scores(question, texts)], k=ranking.rrf_k) if ranking.fusion else cos
    )
    candidates = [
        ScoredChunk(chunk=chunks[i], url=urls[i], score=s, vector=vectors[i].tolist())
        for i, s in zip(keep, scores, strict=True)
    ]
    return [
        [
            r.chunk
            for r in rank_chunks(
                candidates, top_k=200, token_budget=budget, per_source_cap=ranking.per_source_cap
            )
        ]  # fmt: skip
        for budget in budgets
    ]


def token_chunker(max_tokens: int, overlap_tokens: int) -> Chunker:
    """webctx's chunk_page with the given sizes."""
    return lambda page: chunk_page(page, max_tokens=max_tokens, overlap_tokens=overlap_tokens)
