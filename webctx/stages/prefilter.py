"""The lexical first pass of a one-off question: which of a job's chunks are embedded
before its bundle, and which can wait (for the index, at low priority).

Without it every chunk of every page is embedded before ranking: 2,000-4,000 chunks
for 8-20 pages, about a minute of CPU for the local model, while the bundle holds a few
dozen. The ranker fuses cosine and BM25 ranks (`webctx.stages.rank`, RRF k=30), so a chunk
far down the BM25 ranking reaches the bundle only with a near-top cosine. The pass keeps
what can reach it: the best chunks by BM25 over all the job's chunks, each page's best
few (dense retrieval finds the paraphrase BM25 misses, and a page that matched the search
holds it near its lexical best), and the neighbours of the best BM25 hits (an answer often
sits in the sentence after the one that names the question's words).
Measured in bench/latency.py and bench/answer_recall.py (docs/benchmarks.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence, Set
from dataclasses import dataclass

from webctx.models import Chunk
from webctx.stages.sparse import bm25_scores


@dataclass(frozen=True)
class LexicalPass:
    """BM25 of every chunk for the question, and the split of the chunks (by position)
    into those embedded now and those deferred."""

    scores: list[float]
    selected: list[int]
    deferred: list[int]


def select_candidates(
    question: str,
    chunks: Sequence[Chunk],
    *,
    limit: int,
    per_page: int = 0,
    neighbours: int = 0,
) -> LexicalPass:
    """Score `chunks` by BM25 for `question` (document frequencies over all of them) and
    select the best `limit`, each page's best `per_page`, and the chunks next to the best
    `neighbours` hits (same page, index one apart). Ties go to the earlier chunk, so the
    selection is deterministic; `selected` and `deferred` keep the input order."""
    if limit < 0 or per_page < 0 or neighbours < 0:
        raise ValueError("limit, per_page and neighbours must not be negative")
    scores = bm25_scores(question, [c.text for c in chunks])
    return _select(scores, chunks, limit=limit, per_page=per_page, neighbours=neighbours)


def _select(
    scores: Sequence[float], chunks: Sequence[Chunk], *, limit: int, per_page: int,
    neighbours: int,
) -> LexicalPass:  # fmt: skip
    """The pass's split of `chunks` for the BM25 `scores` (see `select_candidates`)."""
    order = sorted(range(len(chunks)), key=lambda i: (-scores[i], i))
    chosen = set(order[:limit])
    by_page: dict[str, list[int]] = defaultdict(list)
    for i in order:  # best first, so each page's list is too
        by_page[chunks[i].content_sha256].append(i)
    for best in by_page.values():
        chosen.update(best[:per_page])
    chosen.update(_neighbours(chunks, order[:neighbours]))
    selected = sorted(chosen)
    deferred = [i for i in range(len(chunks)) if i not in chosen]
    return LexicalPass(scores=list(scores), selected=selected, deferred=deferred)


def narrow_pass(
    full: LexicalPass,
    chunks: Sequence[Chunk],
    *,
    limit: int,
    per_page: int,
    neighbours: int,
    affordable: int,
    embedded: Set[int] = frozenset(),
) -> LexicalPass:
    """`full` (the pass at `limit`/`per_page`/`neighbours`) cut to at most `affordable`
    chunks still to embed: the three scaled down together, by the largest factor found
    (bisection) that fits, plus every chunk of `full` already `embedded` (free). `full`
    itself when it fits. The scaled pass is the one the recall benchmark measures at that
    size (bench/prefilter_recall.py), and its chunks are the best of `full` by BM25 rank,
    by rank within each page and next to the best hits alike."""
    if sum(1 for i in full.selected if i not in embedded) <= affordable:
        return full
    fits = LexicalPass(scores=full.scores, selected=[], deferred=list(range(len(chunks))))
    low, high = 0.0, 1.0
    for _ in range(10):  # 1/1024 of the knobs: finer than one chunk of a job's selection
        scale = (low + high) / 2
        tried = _select(full.scores, chunks, limit=round(limit * scale),
                        per_page=round(per_page * scale),
                        neighbours=round(neighbours * scale))  # fmt: skip
        if sum(1 for i in tried.selected if i not in embedded) <= affordable:
            fits, low = tried, scale
        else:
            high = scale
    keep = set(fits.selected) | (embedded & set(full.selected))
    return LexicalPass(scores=full.scores, selected=sorted(keep),
                       deferred=[i for i in range(len(chunks)) if i not in keep])  # fmt: skip


def _neighbours(chunks: Sequence[Chunk], hits: Sequence[int]) -> set[int]:
    """Positions of the chunks right before and after each hit on the same page."""
    at = {(c.content_sha256, c.index): i for i, c in enumerate(chunks)}
    found: set[int] = set()
    for i in hits:
        page, index = chunks[i].content_sha256, chunks[i].index
        for other in (index - 1, index + 1):
            if (page, other) in at:
                found.add(at[(page, other)])
    return found
