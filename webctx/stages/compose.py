"""Compositions of stage functions that one task runs: index a page, answer a question."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from webctx.models import Bundle, BundleStats, Chunk, Failure, Page, Retrieval, ScoredChunk
from webctx.net.ratelimit import RedisRateLimiter
from webctx.protocols import Embedder, EmbeddingCache, VectorStore
from webctx.settings import ChunkSettings, EmbedSettings, PrefilterSettings
from webctx.stages.bundle import build_bundle
from webctx.stages.chunk import chunk_page
from webctx.stages.embed import (
    CachedEmbedOutcome,
    embed_texts,
    embed_with_cache,
    parallel_requests,
)
from webctx.stages.facets import split_facets
from webctx.stages.prefilter import LexicalPass, narrow_pass, select_candidates
from webctx.stages.rank import RRF_K, fuse_lexical, ranks_by_score, rrf
from webctx.stages.shares import Packed, cover_bundle, facet_pools_by_text, pack_facets
from webctx.stages.sparse import TermCounts
from webctx.stages.store import make_points, store_chunks, vector_lookup

logger = logging.getLogger(__name__)


@dataclass
class IndexOutcome:
    """What indexing one page cost."""

    chunks: int
    requests: int
    tokens: int
    cache_hits: int = 0
    tokens_saved: int = 0


@dataclass
class EmbeddedPage:
    """A page's chunks and their vectors, not yet stored (the embed stage's output)."""

    chunks: list[Chunk]
    vectors: list[list[float]]
    outcome: IndexOutcome


def embed_page(
    page: Page,
    *,
    embedder: Embedder,
    chunking: ChunkSettings,
    embedding: EmbedSettings,
    cache: EmbeddingCache | None = None,
    limiter: RedisRateLimiter | None = None,
) -> EmbeddedPage:
    """Chunk a page and embed its chunks; nothing touches the vector store.

    With a `cache`, chunks embedded before (by any job) are not sent again; with a
    `limiter`, requests share the key's rate limit with every worker."""
    chunks = chunk_page(
        page, max_tokens=chunking.max_tokens, overlap_tokens=chunking.overlap_tokens
    )
    if not chunks:
        return EmbeddedPage([], [], IndexOutcome(chunks=0, requests=0, tokens=0))
    outcome = _embed_chunks([c.text for c in chunks], embedder, embedding, cache, limiter)
    cost = IndexOutcome(
        chunks=len(chunks),
        requests=outcome.requests,
        tokens=outcome.tokens,
        cache_hits=outcome.cache_hits,
        tokens_saved=outcome.tokens_saved,
    )
    return EmbeddedPage(chunks, outcome.vectors, cost)


def store_page(
    embedded: EmbeddedPage, *, store: VectorStore, url: str, model: str, durable: bool = True
) -> int:
    """Upsert an embedded page's chunks (idempotent by point id); how many were written.
    With `durable` False, a store that flushes leaves them to its next flush."""
    if not embedded.chunks:
        return 0
    points = make_points(embedded.chunks, embedded.vectors, url=url, model=model)
    return store_chunks(store, points, durable=durable)


def index_page(
    page: Page,
    *,
    embedder: Embedder,
    store: VectorStore,
    chunking: ChunkSettings,
    embedding: EmbedSettings,
    cache: EmbeddingCache | None = None,
    limiter: RedisRateLimiter | None = None,
) -> IndexOutcome:
    """Chunk, embed and store a page in one call (`embed_page`, then `store_page`)."""
    embedded = embed_page(
        page, embedder=embedder, chunking=chunking, embedding=embedding, cache=cache,
        limiter=limiter,
    )  # fmt: skip
    store_page(embedded, store=store, url=page.final_url, model=embedder.model)
    return embedded.outcome


def _embed_chunks(
    texts: list[str],
    embedder: Embedder,
    embedding: EmbedSettings,
    cache: EmbeddingCache | None,
    limiter: RedisRateLimiter | None,
) -> CachedEmbedOutcome:
    """Embed through cache and limiter when given; else exactly as before (embed_texts)."""
    if cache is None and limiter is None:
        plain = embed_texts(
            texts,
            embedder,
            max_inputs=embedding.max_inputs_per_request,
            max_tokens_per_request=embedding.max_tokens_per_request,
            max_input_tokens=embedding.max_input_tokens,
            max_attempts=embedding.max_attempts,
            parallel=parallel_requests(embedder, embedding.parallel_requests),
        )
        return CachedEmbedOutcome(**plain.model_dump())
    return embed_with_cache(
        texts,
        embedder,
        cache=cache,
        limiter=limiter,
        max_inputs=embedding.max_inputs_per_request,
        max_tokens_per_request=embedding.max_tokens_per_request,
        max_input_tokens=embedding.max_input_tokens,
        max_attempts=embedding.max_attempts,
        parallel=parallel_requests(embedder, embedding.parallel_requests),
    )


def _count(stats: BundleStats, outcome: CachedEmbedOutcome) -> None:
    """Add what an embedding call cost (and saved) to the bundle's stats."""
    stats.embed_requests += outcome.requests
    stats.tokens_embedded += outcome.tokens
    stats.cache_hits += outcome.cache_hits
    stats.tokens_saved += outcome.tokens_saved


def candidate_limit(top_k: int, pages: int) -> int:
    """How many nearest chunks to pull before fusion, de-duplication and packing: enough
    to hold every chunk of ordinary pages, as BM25 is computed over the candidates."""
    return max(top_k * 10, pages * 128, 100)


def retrieve_candidates(
    *,
    question: str,
    pages: Mapping[str, Page],
    stats: BundleStats,
    embedder: Embedder,
    store: VectorStore,
    top_k: int,
    embedding: EmbedSettings,
    cache: EmbeddingCache | None = None,
    limiter: RedisRateLimiter | None = None,
    question_vector: Sequence[float] | None = None,
    counted: Mapping[str, TermCounts] | None = None,
) -> list[ScoredChunk]:
    """Embed the question (unless its vector is given, already accounted for), pull the
    job's nearest chunks (without their vectors: `vector_lookup` gets the few that ranking
    needs), fuse cosine and BM25 ranks (`counted`: chunks' BM25 term counts counted
    earlier)."""
    if question_vector is None:
        outcome = _embed_chunks([question], embedder, embedding, cache, limiter)
        _count(stats, outcome)
        question_vector = outcome.vectors[0]
    found = store.search(
        question_vector,
        limit=candidate_limit(top_k, len(pages)),
        content_sha256s=list(pages),
        with_vectors=False,  # rank_chunks looks up the few it needs (`vector_lookup`)
    )
    kept = [c for c in found if c.chunk.content_sha256 in pages]
    # A point's stored url is whichever job wrote it last; cite this job's URL.
    urls = {sha: p.url for sha, p in pages.items()}
    return fuse_lexical(question, kept, urls=urls, counted=counted)


def facet_pools(
    *,
    question: str,
    facets: Sequence[str],
    pages: Mapping[str, Page],
    stats: BundleStats,
    embedder: Embedder,
    store: VectorStore,
    top_k: int,
    embedding: EmbedSettings,
    cache: EmbeddingCache | None = None,
    limiter: RedisRateLimiter | None = None,
    question_vector: Sequence[float] | None = None,
    counted: Mapping[str, TermCounts] | None = None,
) -> list[list[ScoredChunk]]:
    """Each facet's fused candidates (`retrieve_candidates`); one facet is the question,
    retrieved exactly as it always was."""
    if len(facets) == 1:
        return [retrieve_candidates(
            question=question, pages=pages, stats=stats, embedder=embedder, store=store,
            top_k=top_k, embedding=embedding, cache=cache, limiter=limiter,
            question_vector=question_vector, counted=counted,
        )]  # fmt: skip
    outcome = _embed_chunks(list(facets), embedder, embedding, cache, limiter)
    _count(stats, outcome)
    return [retrieve_candidates(
        question=facet, pages=pages, stats=stats, embedder=embedder, store=store,
        top_k=top_k, embedding=embedding, question_vector=vector,
    ) for facet, vector in zip(facets, outcome.vectors, strict=True)]  # fmt: skip


def answer_question(
    *,
    job_id: str,
    question: str,
    queries: Sequence[str],
    pages: Mapping[str, Page],
    failures: Sequence[Failure],
    stats: BundleStats,
    embedder: Embedder,
    store: VectorStore,
    top_k: int,
    token_budget: int,
    embedding: EmbedSettings,
    cache: EmbeddingCache | None = None,
    limiter: RedisRateLimiter | None = None,
    question_vector: Sequence[float] | None = None,
    retrievals: Mapping[str, Retrieval] | None = None,
    counted: Mapping[str, TermCounts] | None = None,
    facets: Sequence[str] | None = None,
) -> Bundle:
    """Retrieve and fuse the job's chunks for each facet of the question (`facet_pools`),
    pack each its share, cite, and say how well each facet is covered
    (`webctx.stages.shares`)."""
    facets = split_facets(question) if facets is None else list(facets)
    pools = facet_pools(
        question=question, facets=facets, pages=pages, stats=stats, embedder=embedder,
        store=store, top_k=top_k, embedding=embedding, cache=cache, limiter=limiter,
        question_vector=question_vector, counted=counted,
    )  # fmt: skip
    packed = pack_facets(facets, pools, top_k=top_k, token_budget=token_budget,
                         vectors=vector_lookup(store, embedder.model))  # fmt: skip
    return covered_bundle(
        job_id=job_id, question=question, queries=queries, pages=pages, facets=facets,
        pools=pools, packed=packed, failures=failures, stats=stats, retrievals=retrievals,
    )  # fmt: skip


def covered_bundle(
    *,
    job_id: str,
    question: str,
    queries: Sequence[str],
    pages: Mapping[str, Page],
    facets: Sequence[str],
    pools: Sequence[Sequence[ScoredChunk]],
    packed: Packed,
    failures: Sequence[Failure],
    stats: BundleStats,
    retrievals: Mapping[str, Retrieval] | None = None,
) -> Bundle:
    """The cited bundle of packed chunks, with its coverage."""
    bundle = build_bundle(job_id=job_id, question=question, queries=queries, pages=pages,
                          ranked=packed.ranked, failures=failures, stats=stats,
                          retrievals=retrievals)  # fmt: skip
    bundle.coverage = cover_bundle(bundle, facets, packed, pools)
    return bundle


@dataclass
class Prefiltered:
    """A one-off job's candidates after the lexical first pass (`prefilter_candidates`):
    the embedded ones, fused and with their vectors, and how many chunks were deferred."""

    candidates: list[ScoredChunk]
    deferred: int


def prefilter_candidates(
    *,
    question: str,
    pages: Mapping[str, Page],
    stats: BundleStats,
    embedder: Embedder,
    chunking: ChunkSettings,
    embedding: EmbedSettings,
    prefilter: PrefilterSettings,
    cache: EmbeddingCache | None = None,
    limiter: RedisRateLimiter | None = None,
    question_vector: Sequence[float] | None = None,
    chunks_per_s: float | None = None,
) -> Prefiltered:
    """Chunk the job's pages, keep the chunks BM25 (over all of them) says the ranker can
    reach, embed those (and the question, unless given) in as few requests as the caps
    allow, and fuse their cosine and BM25 ranks as `fuse_lexical` does. `chunks_per_s`:
    an in-process model's speed, to which the pass is narrowed (`fit_to_speed`)."""
    size, overlap = chunking.max_tokens, chunking.overlap_tokens
    chunks = [
        c for p in pages.values() for c in chunk_page(p, max_tokens=size, overlap_tokens=overlap)
    ]
    lexical = select_candidates(
        question, chunks, limit=prefilter.chunks, per_page=prefilter.per_page,
        neighbours=prefilter.neighbours,
    )  # fmt: skip
    if chunks_per_s is not None:
        lexical = fit_to_speed(lexical, chunks, prefilter=prefilter, chunks_per_s=chunks_per_s,
                               embedded=lambda ts: _cached(ts, embedder, cache))  # fmt: skip
    chosen = [chunks[i] for i in lexical.selected]
    texts = [c.text for c in chosen]
    if question_vector is None:
        texts.insert(0, question)
    outcome = _embed_chunks(texts, embedder, embedding, cache, limiter)
    _count(stats, outcome)
    stats.chunks = len(chunks)
    stats.embedded_at_rank = len(texts) - outcome.cache_hits
    vectors = outcome.vectors
    if question_vector is None:
        question_vector, vectors = vectors[0], vectors[1:]
    bm25 = [lexical.scores[i] for i in lexical.selected]
    candidates = fuse_selected(question_vector, chosen, vectors, bm25, pages)
    return Prefiltered(candidates, deferred=len(lexical.deferred))


def fit_to_speed(
    lexical: LexicalPass,
    chunks: Sequence[Chunk],
    *,
    prefilter: PrefilterSettings,
    chunks_per_s: float,
    embedded: Callable[[list[str]], set[int]],
) -> LexicalPass:
    """The pass narrowed (`narrow_pass`) to the chunks a model embedding `chunks_per_s`
    can embed within `prefilter.embed_budget_s` (at least `min_chunks`); the chunks of
    the full pass already `embedded` (positions among the texts given) are free."""
    if not prefilter.embed_budget_s:
        return lexical
    affordable = max(prefilter.min_chunks, int(prefilter.embed_budget_s * chunks_per_s))
    if len(lexical.selected) <= affordable:
        return lexical
    found = embedded([chunks[i].text for i in lexical.selected])
    narrowed = narrow_pass(
        lexical, chunks, limit=prefilter.chunks, per_page=prefilter.per_page,
        neighbours=prefilter.neighbours, affordable=affordable,
        embedded={lexical.selected[n] for n in found},
    )  # fmt: skip
    logger.info("first pass narrowed to the model's speed", extra={
        "chunks_per_s": round(chunks_per_s), "affordable": affordable,
        "selected": len(lexical.selected), "kept": len(narrowed.selected),
        "embedded_ahead": len(found)})  # fmt: skip
    return narrowed


def _cached(texts: list[str], embedder: Embedder, cache: EmbeddingCache | None) -> set[int]:
    """Positions of `texts` whose vectors `cache` holds for `embedder`'s model."""
    if cache is None:
        return set()
    dimensions: int | None = getattr(embedder, "dimensions", None)
    found = cache.get_many(embedder.model, dimensions, texts)
    return {n for n, vector in enumerate(found) if vector is not None}


def fuse_selected(
    question_vector: Sequence[float],
    chosen: Sequence[Chunk],
    vectors: Sequence[Sequence[float]],
    bm25: Sequence[float],
    pages: Mapping[str, Page],
) -> list[ScoredChunk]:
    """The chosen chunks scored by reciprocal rank fusion of their cosine to the question
    and their BM25 (taken over all the job's chunks), with their vectors."""
    cosines = _cosines(question_vector, vectors)
    fused = rrf([ranks_by_score(cosines), ranks_by_score(bm25)], k=RRF_K)
    # Built without validation: our own chunks and floats (hundreds of 384-float vectors).
    return [
        ScoredChunk.model_construct(
            chunk=c, url=pages[c.content_sha256].url, score=fused[n], vector=v, dense=cosines[n]
        )  # fmt: skip
        for n, (c, v) in enumerate(zip(chosen, vectors, strict=True))
    ]


def _cosines(question: Sequence[float], vectors: Sequence[Sequence[float]]) -> list[float]:
    """Cosine of each vector with the question's (0.0 for a zero vector)."""
    if not vectors:
        return []
    matrix = np.asarray(vectors, dtype=np.float64)
    q = np.asarray(question, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1) * (np.linalg.norm(q) or 1.0)
    return [float(x) for x in np.divide(matrix @ q, norms, out=np.zeros(len(matrix)),
                                        where=norms > 0)]  # fmt: skip


def answer_prefiltered(
    *,
    job_id: str,
    question: str,
    queries: Sequence[str],
    pages: Mapping[str, Page],
    failures: Sequence[Failure],
    stats: BundleStats,
    embedder: Embedder,
    top_k: int,
    token_budget: int,
    chunking: ChunkSettings,
    embedding: EmbedSettings,
    prefilter: PrefilterSettings,
    cache: EmbeddingCache | None = None,
    limiter: RedisRateLimiter | None = None,
    question_vector: Sequence[float] | None = None,
    retrievals: Mapping[str, Retrieval] | None = None,
    facets: Sequence[str] | None = None,
    chunks_per_s: float | None = None,
) -> Bundle:
    """A one-off job's bundle from its pages alone: `prefilter_candidates`, then pack and
    cite as `answer_question` does. The vector store is not read (nor written: the pages
    are stored afterwards, for the index)."""
    found = prefilter_candidates(
        question=question, pages=pages, stats=stats, embedder=embedder, chunking=chunking,
        embedding=embedding, prefilter=prefilter, cache=cache, limiter=limiter,
        question_vector=question_vector, chunks_per_s=chunks_per_s,
    )  # fmt: skip
    facets = split_facets(question) if facets is None else list(facets)
    pools = [found.candidates]
    if len(facets) > 1:  # each facet scores the same candidates (they carry vectors)
        outcome = _embed_chunks(facets, embedder, embedding, cache, limiter)
        _count(stats, outcome)
        vectors = dict(zip(facets, outcome.vectors, strict=True))
        pools = facet_pools_by_text(facets, vectors, found.candidates)
    packed = pack_facets(facets, pools, top_k=top_k, token_budget=token_budget)
    return covered_bundle(
        job_id=job_id, question=question, queries=queries, pages=pages, facets=facets,
        pools=pools, packed=packed, failures=failures, stats=stats, retrievals=retrievals,
    )  # fmt: skip
