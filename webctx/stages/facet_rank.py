"""A deep job's bundle packed facet by facet: each facet of the question ranks the job's
chunks as a question of its own, and the bundle takes their best passages in turn, so the
facets share the token budget.

Ranked against the whole compound question, one facet's passages can fill the budget and
leave the other's answer out although its page was fetched: on the QA benchmark's compound
questions most of `fast`'s misses were that (bench/deep.py). A `fast` job never comes here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from webctx.models import Bundle, BundleStats, Failure, Page, Retrieval, ScoredChunk
from webctx.stages.bundle import build_bundle
from webctx.stages.rank import VectorLookup, rank_chunks

Candidates = Callable[[str], list[ScoredChunk]]
"""The job's candidate chunks scored for one question (a facet)."""


def rank_by_facets(
    facets: Sequence[str],
    candidates: Candidates,
    *,
    top_k: int,
    token_budget: int,
    vectors: VectorLookup | None = None,
) -> list[ScoredChunk]:
    """Each facet's best chunks, taken in turn (the first of each facet, then the
    second...) while they fit `top_k` and `token_budget`, each chunk once: the facets
    share the budget evenly unless one runs out of passages."""
    lists = [rank_chunks(candidates(f), top_k=top_k, token_budget=token_budget,
                         vectors=vectors) for f in facets]  # fmt: skip
    merged: list[ScoredChunk] = []
    seen: set[tuple[str, int, int]] = set()
    tokens = 0
    for turn in range(max((len(r) for r in lists), default=0)):
        for ranked in lists:
            if turn >= len(ranked):
                continue
            chunk = ranked[turn]
            key = (chunk.chunk.content_sha256, chunk.chunk.start, chunk.chunk.end)
            if key in seen or tokens + chunk.chunk.tokens > token_budget:
                continue
            seen.add(key)
            tokens += chunk.chunk.tokens
            merged.append(chunk)
            if len(merged) == top_k:
                return merged
    return merged


def bundle_by_facets(
    *,
    job_id: str,
    question: str,
    facets: Sequence[str],
    candidates: Candidates,
    queries: Sequence[str],
    pages: Mapping[str, Page],
    failures: Sequence[Failure],
    stats: BundleStats,
    top_k: int,
    token_budget: int,
    vectors: VectorLookup | None = None,
    retrievals: Mapping[str, Retrieval] | None = None,
) -> Bundle:
    """The bundle of `rank_by_facets`, cited as any other."""
    ranked = rank_by_facets(facets, candidates, top_k=top_k, token_budget=token_budget,
                            vectors=vectors)  # fmt: skip
    return build_bundle(job_id=job_id, question=question, queries=queries, pages=pages,
                        ranked=ranked, failures=failures, stats=stats,
                        retrievals=retrievals)  # fmt: skip
