"""Hybrid search of a tenant's index: dense + BM25, fused by reciprocal rank.

A search reads the tenant's published generation once and asks the store for the points
live at it (`webctx.index.generations`): each page whole, old or new, never both, without
listing the tenant's pages. Both halves rank by point id alone; only the fused top
`limit` points' payloads are read, then their pages' records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from webctx.stages.embed import embed_texts
from webctx.stages.instructions import text_flags
from webctx.stages.rank import ranks_in_order, rrf

if TYPE_CHECKING:  # the index's re-index code (and trafilatura) stays out of clients
    from webctx.index.refresh import IndexContext

RRF_K = 60
"""The index's fusion constant: the paper's 60 (Cormack et al. 2009). The job rank's 30
(`webctx.stages.rank.RRF_K`) was measured on job candidates; index search has not been
measured against other values."""


class IndexHit(BaseModel):
    """One chunk found in the index, with its page's metadata and both ranks."""

    url: str
    title: str
    site: str
    published: str | None
    source_id: str
    content_sha256: str
    start: int
    end: int
    text: str
    score: float
    dense_rank: int | None = None
    sparse_rank: int | None = None
    flags: list[str] = Field(default_factory=list)
    """`["instructions"]` when the passage or its title addresses the model reading it."""


def search_index(
    query: str,
    *,
    tenant: str,
    ctx: IndexContext,
    limit: int = 10,
    site: str | None = None,
    source_id: str | None = None,
    published_from: str | None = None,
    published_to: str | None = None,
) -> list[IndexHit]:
    """Hybrid search of a tenant's current pages: dense + BM25, fused by RRF."""
    if limit < 1:
        return []
    scope = ctx.records.scope(tenant, store=ctx.store, site=site, source_id=source_id,
                            published_from=published_from,
                            published_to=published_to)  # fmt: skip
    if scope is None:
        return []
    pool, e = max(limit * 5, 50), ctx.embedding
    vector = embed_texts([query], ctx.embedder, max_inputs=1,
                         max_tokens_per_request=e.max_tokens_per_request,
                         max_input_tokens=e.max_input_tokens,
                         max_attempts=e.max_attempts).vectors[0]  # fmt: skip
    # Rank by point id alone, then read the payloads of the fused top `limit` only: the
    # 2 x `pool` candidates' payloads (text included) cost more than both searches.
    ranked = (ctx.store.rank_live(vector, limit=pool, scope=scope),
              ctx.store.rank_live_sparse(query, limit=pool, scope=scope))  # fmt: skip
    ranks = [ranks_in_order(ids) for ids in ranked]
    fused = sorted(rrf(ranks, k=RRF_K).items(), key=lambda item: -item[1])[:limit]
    points = ctx.store.retrieve([pid for pid, _ in fused])
    fused = [(pid, score) for pid, score in fused if pid in points]  # swept since: dropped
    records = ctx.records.records_of(tenant, [points[pid].chunk.content_sha256 for pid, _ in fused])
    out = []
    for pid, score in fused:
        point = points[pid]
        chunk, record = point.chunk, records[point.chunk.content_sha256]
        out.append(IndexHit(
            url=record.url or point.url, title=record.title, site=record.site,
            published=record.published, source_id=record.source_id,
            content_sha256=chunk.content_sha256, start=chunk.start, end=chunk.end,
            text=chunk.text, score=round(score, 6), dense_rank=ranks[0].get(pid),
            sparse_rank=ranks[1].get(pid), flags=text_flags(chunk.text, record.title),
        ))  # fmt: skip
    return out
