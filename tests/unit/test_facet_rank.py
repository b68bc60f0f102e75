"""A deep job's bundle packed facet by facet: each facet gets its share of the budget, so
one facet's many strong passages cannot crowd out the other's answer."""

from __future__ import annotations

from tests.factories import make_scored
from webctx.models import ScoredChunk
from webctx.stages.facet_rank import rank_by_facets
from webctx.stages.rank import rank_chunks

LIGHTHOUSE = [make_scored(f"The lighthouse was built in 1871, part {i}.", score=0.9 - i / 100,
                          url=f"https://a.example/{i}", tokens=100) for i in range(10)]  # fmt: skip
STORM = [make_scored("Orrin Tallis tended the beacon lamps in the storm.", score=0.4,
                     url="https://b.example/storm", tokens=100)]  # fmt: skip


def _candidates(facet: str) -> list[ScoredChunk]:
    """The lighthouse passages score high for both facets; the storm one only for its own."""
    if "storm" in facet:
        scaled = [c.model_copy(update={"score": c.score / 2}) for c in LIGHTHOUSE]
        return [STORM[0].model_copy(update={"score": 0.6}), *scaled]
    return LIGHTHOUSE + [STORM[0].model_copy(update={"score": 0.1})]


def test_each_facet_keeps_its_share_where_one_ranking_gives_all_to_the_first() -> None:
    both = sorted(LIGHTHOUSE + STORM, key=lambda c: -c.score)
    whole = rank_chunks(both, top_k=60, token_budget=500, per_source_cap=None)
    assert all("Tallis" not in c.chunk.text for c in whole)  # the whole question's ranking
    split = rank_by_facets(["When was it built?", "Who tended it in the storm?"], _candidates,
                           top_k=60, token_budget=500)  # fmt: skip
    texts = [c.chunk.text for c in split]
    assert any("Tallis" in t for t in texts) and any("1871" in t for t in texts)
    assert sum(c.chunk.tokens for c in split) <= 500
    assert len({(c.chunk.content_sha256, c.chunk.start) for c in split}) == len(split)


def test_a_chunk_both_facets_rank_is_taken_once_and_top_k_holds() -> None:
    same = [*LIGHTHOUSE[:3]]
    split = rank_by_facets(["a b", "c d"], lambda _: same, top_k=2, token_budget=10_000)
    assert [c.url for c in split] == [LIGHTHOUSE[0].url, LIGHTHOUSE[1].url]
