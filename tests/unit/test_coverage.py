"""Coverage: a facet's signals, its calibrated confidence and status, and packing by
facet (shares of the budget, abstention)."""

from __future__ import annotations

import pytest

from tests.factories import make_bundle_for, make_scored, one_hot
from webctx.models import ScoredChunk
from webctx.stages import coverage as cov
from webctx.stages.bundle import render_markdown
from webctx.stages.rank import rank_chunks
from webctx.stages.shares import MISSING_KEEP, cover_bundle, pack_facets

ANSWER = "The Eiffel Tower was completed in 1889 for the World's Fair in Paris."
OFF_TOPIC = "Bananas are rich in potassium and grow in tropical climates worldwide."


def _scored(text: str, dense: float, n: int, *, url: str = "", tokens: int = 20) -> ScoredChunk:
    chunk = make_scored(text, url=url or f"https://site{n}.example/p", score=1.0 / (30 + n),
                        tokens=tokens, vector=one_hot(n, 256))  # fmt: skip
    return chunk.model_copy(update={"dense": dense})


def _filler(n: int, dense: float = 0.1) -> list[ScoredChunk]:
    return [_scored(f"{OFF_TOPIC} Note {i}.", dense, 100 + i) for i in range(n)]


@pytest.mark.parametrize(
    ("question", "kind"),
    [("When was the Eiffel Tower completed?", "date"), ("What year did it open?", "date"),
     ("How many people visit it?", "number"), ("Who designed the tower?", "name"),
     ("Where is the tower?", "name"), ("What is the tower made of?", None)],
)  # fmt: skip
def test_the_answer_type_follows_the_question_word(question: str, kind: str | None) -> None:
    assert cov.answer_type(question) == kind


def test_a_passage_holding_the_asked_type_is_a_typed_hit() -> None:
    facet = "When was the Eiffel Tower completed?"
    found = cov.facet_signals(facet, [_scored(ANSWER, 0.7, 0)], _filler(10))
    assert found.typed == 1.0 and found.typed_hit == 1.0
    undated = cov.facet_signals(facet, [_scored("The Eiffel Tower is tall.", 0.7, 0)],
                                _filler(10))  # fmt: skip
    assert undated.typed_hit == 0.0


def test_rare_words_of_the_facet_weigh_more_than_words_every_candidate_holds() -> None:
    facet = "When was the Eiffel Tower completed?"
    pool = [_scored(f"The Eiffel Tower at night {i}.", 0.5, i) for i in range(10)]
    topic_only = cov.facet_signals(facet, pool[:1], pool)
    specific = cov.facet_signals(facet, [_scored("The tower was completed then.", 0.5, 20)],
                                 pool)  # fmt: skip
    assert specific.terms > topic_only.terms


def test_a_passage_that_answers_is_more_confident_than_one_off_topic() -> None:
    facet = "When was the Eiffel Tower completed?"
    pool = _filler(20)
    good = cov.confidence_of(cov.facet_signals(facet, [_scored(ANSWER, 0.75, 0)], pool))
    bad = cov.confidence_of(cov.facet_signals(facet, [_scored(OFF_TOPIC, 0.05, 0)], pool))
    assert 0.0 <= bad < cov.MISSING <= cov.SUPPORTED <= good <= 1.0


def test_a_facet_without_passages_is_missing_and_the_bundle_insufficient() -> None:
    facets = ["When was the Eiffel Tower completed?", "Who painted the Mona Lisa?"]
    chunks = [_scored(ANSWER, 0.75, 0)]
    coverage = cov.assess_coverage(facets, chunks, facet_of=[0], pools=[_filler(20), []])
    first, second = coverage.facets
    assert first.chunks == [0] and first.status == "supported"
    assert second.chunks == [] and second.status == "missing" and second.confidence == 0.0
    assert coverage.sufficient is False
    assert coverage.confidence == pytest.approx(first.confidence * second.confidence, abs=1e-4)
    assert coverage.notes == ["No source found for: Who painted the Mona Lisa?"]


def test_one_facet_index_per_chunk_is_required() -> None:
    with pytest.raises(ValueError, match="one facet index per chunk"):
        cov.assess_coverage(["a b"], [_scored(ANSWER, 0.5, 0)], facet_of=[])


def test_one_facet_is_packed_exactly_as_rank_chunks_packs_it() -> None:
    pool = [_scored(ANSWER, 0.75, 0), *_filler(30, dense=0.6)]
    packed = pack_facets(["When was the Eiffel Tower completed?"], [pool], top_k=60,
                         token_budget=200)  # fmt: skip
    assert packed.ranked == rank_chunks(pool, top_k=60, token_budget=200)
    assert packed.facet_of == [0] * len(packed.ranked)


def test_each_facet_gets_its_share_and_no_chunk_twice() -> None:
    tower = [_scored(f"{ANSWER} Part {i}.", 0.7, i) for i in range(20)]
    lisa = [_scored(f"Leonardo da Vinci painted the Mona Lisa in 1503. Part {i}.", 0.7, 40 + i)
            for i in range(20)]  # fmt: skip
    shared = tower[0]
    facets = ["When was the Eiffel Tower completed?", "Who painted the Mona Lisa?"]
    packed = pack_facets(facets, [tower, [shared, *lisa]], top_k=60, token_budget=200)
    assert packed.facet_of.count(0) == 5 and packed.facet_of.count(1) == 5  # 100 tokens each
    keys = [(c.chunk.content_sha256, c.chunk.start) for c in packed.ranked]
    assert len(keys) == len(set(keys))
    assert sum(c.chunk.tokens for c in packed.ranked) <= 200


def test_a_missing_facet_keeps_its_nearest_passages_and_gives_its_share_away() -> None:
    tower = [_scored(f"{ANSWER} Part {i}.", 0.7, i) for i in range(20)]
    nothing = _filler(20, dense=0.02)
    facets = ["When was the Eiffel Tower completed?", "Who painted the Mona Lisa?"]
    packed = pack_facets(facets, [tower, nothing], top_k=60, token_budget=200)
    assert packed.facet_of.count(1) == MISSING_KEEP
    assert packed.facet_of.count(0) == 10 - MISSING_KEEP
    kept = pack_facets(facets, [tower, nothing], top_k=60, token_budget=200, abstain=False)
    assert kept.facet_of.count(1) == 5


def test_markdown_says_plainly_what_no_source_was_found_for() -> None:
    tower = [_scored(f"{ANSWER} Part {i}.", 0.7, i) for i in range(4)]
    facets = ["When was the Eiffel Tower completed?", "Who painted the Mona Lisa?"]
    pools = [tower, _filler(4, dense=0.02)]
    packed = pack_facets(facets, pools, top_k=60, token_budget=200)
    bundle = make_bundle_for(packed.ranked)
    bundle.coverage = cover_bundle(bundle, facets, packed, pools)
    text = render_markdown(bundle)
    assert "Coverage: insufficient" in text
    assert "No source found for: Who painted the Mona Lisa?" in text
    assert "- supported" in text and "- missing" in text


def test_the_only_facet_found_missing_keeps_every_passage_and_says_so() -> None:
    pool = _filler(30, dense=0.02)
    facets = ["Who painted the Mona Lisa?"]
    packed = pack_facets(facets, [pool], top_k=60, token_budget=200)
    assert cov.status_of(packed.confidences[0]) == "missing"  # type: ignore[index]
    assert packed.ranked == rank_chunks(pool, top_k=60, token_budget=200)
    bundle = make_bundle_for(packed.ranked)
    coverage = cover_bundle(bundle, facets, packed, [pool])
    assert coverage.sufficient is False
    assert coverage.notes == ["No source found for: Who painted the Mona Lisa?"]
    assert len(coverage.facets[0].chunks) == len(packed.ranked) > MISSING_KEEP


def test_no_facet_is_cut_when_every_facet_is_missing() -> None:
    facets = ["When was the Eiffel Tower completed?", "Who painted the Mona Lisa?"]
    pools = [_filler(20, dense=0.02), [_scored(f"{OFF_TOPIC} Other {i}.", 0.02, 60 + i)
                                       for i in range(20)]]  # fmt: skip
    packed = pack_facets(facets, pools, top_k=60, token_budget=200)
    assert all(cov.status_of(p) == "missing" for p in packed.confidences or [])
    assert packed.facet_of.count(0) == 5 and packed.facet_of.count(1) == 5
