"""Pack a bundle facet by facet: each facet's candidates, a fair share of the budget each,
coverage assessed, and no budget spent on a facet nothing supports.

A one-facet question is packed exactly as `rank_chunks` packs it. With several facets the
token budget and `top_k` are shared out in order, what a facet leaves unused going to the
next ones, and a chunk (or a span overlapping it) taken for one facet is not offered to the
others. A facet found missing keeps only its best `MISSING_KEEP` chunks (the nearest
passages, for the reader to see what was found); the rest of its share goes to the facets
that have support. When no facet has support (a one-facet question found missing among
them) nothing is cut: there is no facet to give the share to, and a facet judged missing
wrongly keeps every passage it would have had.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from webctx.models import Bundle, Coverage, ScoredChunk
from webctx.stages.coverage import assess_coverage, confidence_of, facet_signals, status_of
from webctx.stages.rank import RRF_K, VectorLookup, rank_chunks, ranks_by_score, rrf
from webctx.stages.sparse import bm25_scores

MISSING_KEEP = 2
"""Chunks a missing facet keeps: its nearest passages, not a share of the budget."""


@dataclass
class Packed:
    """The chunks of a bundle and the facet each was picked for, best first."""

    ranked: list[ScoredChunk]
    facet_of: list[int]
    confidences: list[float] | None = None
    """Each facet's confidence before a missing facet was cut (what decided the cut)."""


def _key(c: ScoredChunk) -> tuple[str, int]:
    return (c.chunk.content_sha256, c.chunk.start)


def _pack(
    pools: Sequence[Sequence[ScoredChunk]],
    caps: Sequence[int | None],
    *,
    top_k: int,
    token_budget: int,
    vectors: VectorLookup | None,
) -> Packed:
    """Facets in order, each its share of what is left; `caps[f]`: at most that many
    chunks for facet f, the rest of its share left to the others."""
    taken: list[ScoredChunk] = []
    facet_of: list[int] = []
    sharing = [f for f, cap in enumerate(caps) if cap is None]
    for f, pool in enumerate(pools):
        used = sum(c.chunk.tokens for c in taken)
        if caps[f] is None:
            left = len([g for g in sharing if g >= f])
            budget, k = (token_budget - used) // left, (top_k - len(taken)) // left
        else:
            budget, k = token_budget - used, min(caps[f] or 0, top_k - len(taken))
        if budget <= 0 or k <= 0:
            continue
        spans: dict[str, list[tuple[int, int]]] = {}
        for c in taken:
            spans.setdefault(c.chunk.content_sha256, []).append((c.chunk.start, c.chunk.end))
        offered = [c for c in pool if not any(c.chunk.start < e and s < c.chunk.end
                   for s, e in spans.get(c.chunk.content_sha256, ()))]  # fmt: skip
        picked = rank_chunks(offered, top_k=k, token_budget=budget, vectors=vectors)
        taken += picked
        facet_of += [f] * len(picked)
    order = sorted(range(len(taken)), key=lambda i: -taken[i].score)  # as build_bundle sorts
    return Packed([taken[i] for i in order], [facet_of[i] for i in order])


def pack_facets(
    facets: Sequence[str],
    pools: Sequence[Sequence[ScoredChunk]],
    *,
    top_k: int,
    token_budget: int,
    vectors: VectorLookup | None = None,
    abstain: bool = True,
) -> Packed:
    """Each facet's best chunks within its share (see the module docstring); facets found
    missing cut to `MISSING_KEEP` chunks, their share given to the ones not missing
    (unless `abstain` is False, or no facet is left to give it to)."""
    if len(facets) != len(pools):
        raise ValueError("one candidate pool per facet")
    caps: list[int | None] = [None] * len(facets)
    packed = _pack(pools, caps, top_k=top_k, token_budget=token_budget, vectors=vectors)
    packed.confidences = []
    for f, text in enumerate(facets):
        mine = [c for c, of in zip(packed.ranked, packed.facet_of, strict=True) if of == f]
        p = confidence_of(facet_signals(text, mine, pools[f])) if mine else 0.0
        packed.confidences.append(p)
        if status_of(p) == "missing":
            caps[f] = MISSING_KEEP
    if not abstain or all(cap is None for cap in caps) or all(cap is not None for cap in caps):
        return packed
    # A missing facet first: it keeps its nearest passages whatever the others take.
    order = sorted(range(len(facets)), key=lambda f: caps[f] is None)
    again = _pack([pools[f] for f in order], [caps[f] for f in order], top_k=top_k,
                  token_budget=token_budget, vectors=vectors)  # fmt: skip
    return Packed(again.ranked, [order[f] for f in again.facet_of], packed.confidences)


def cover_bundle(
    bundle: Bundle,
    facets: Sequence[str],
    packed: Packed,
    pools: Sequence[Sequence[ScoredChunk]],
) -> Coverage:
    """The coverage of a bundle built from `packed.ranked`, by the bundle's chunk
    indices (build_bundle drops a chunk whose page is missing)."""
    facet_by_key = {_key(c): f for c, f in zip(packed.ranked, packed.facet_of, strict=True)}
    scored_by_key = {_key(c): c for c in packed.ranked}
    sha_of = {s.id: s.content_sha256 for s in bundle.sources}
    keys = [(sha_of[c.source], c.start) for c in bundle.chunks]
    chunks = [scored_by_key[k] for k in keys]
    return assess_coverage(facets, chunks, facet_of=[facet_by_key[k] for k in keys],
                           pools=pools, confidences=packed.confidences)  # fmt: skip


def rescore_for_facet(
    facet: str, facet_vector: Sequence[float], candidates: Sequence[ScoredChunk]
) -> list[ScoredChunk]:
    """Candidates that carry their vectors, scored for one facet as `fuse_selected` scores
    them for the question: RRF of their cosine to the facet and the facet's BM25."""
    if not candidates:
        return []
    matrix = np.asarray([c.vector for c in candidates], dtype=np.float64)
    q = np.asarray(facet_vector, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1) * (np.linalg.norm(q) or 1.0)
    cosines = np.divide(matrix @ q, norms, out=np.zeros(len(matrix)), where=norms > 0)
    dense = [float(x) for x in cosines]
    lexical = bm25_scores(facet, [c.chunk.text for c in candidates])
    fused = rrf([ranks_by_score(dense), ranks_by_score(lexical)], k=RRF_K)
    return [c.model_copy(update={"score": fused[i], "dense": dense[i]})
            for i, c in enumerate(candidates)]  # fmt: skip


def facet_pools_by_text(
    facets: Sequence[str], vectors: Mapping[str, Sequence[float]], base: Sequence[ScoredChunk]
) -> list[list[ScoredChunk]]:
    """Each facet's pool: the base candidates re-scored for it (`rescore_for_facet`)."""
    return [rescore_for_facet(f, vectors[f], base) for f in facets]
