"""rank_chunks: budget, duplicates, overlap windows, per-source cap, top_k."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest

from tests.factories import make_page, make_scored, one_hot
from webctx.models import ScoredChunk
from webctx.stages.rank import (
    VECTOR_WINDOW,
    cosine,
    fuse_lexical,
    rank_chunks,
    ranks_by_score,
    ranks_in_order,
    rrf,
)
from webctx.stages.sparse import bm25_scores, query_terms, term_counts


def _texts(scored: list[ScoredChunk]) -> list[str]:
    return [s.chunk.text for s in scored]


def _random_candidates(rng: random.Random) -> list[ScoredChunk]:
    urls = [f"https://site{i}.example/page" for i in range(5)]
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    candidates: list[ScoredChunk] = []
    for n in range(rng.randint(0, 40)):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) + f" {n}."
        if rng.random() < 0.2 and candidates:
            text = rng.choice(candidates).chunk.text  # the same passage on another site
        vector = [rng.gauss(0, 1) for _ in range(8)]
        candidates.append(
            make_scored(
                text,
                url=rng.choice(urls),
                score=rng.uniform(-1, 1),
                tokens=rng.randint(1, 300),
                vector=vector,
            )
        )
    return candidates


def test_packed_tokens_never_exceed_budget_on_random_inputs() -> None:
    rng = random.Random(1234)
    for _ in range(500):
        candidates = _random_candidates(rng)
        budget, top_k = rng.randint(0, 1200), rng.randint(0, 15)
        cap = rng.randint(1, 4)
        ranked = rank_chunks(candidates, top_k=top_k, token_budget=budget, per_source_cap=cap)
        assert sum(s.chunk.tokens for s in ranked) <= budget
        assert len(ranked) <= top_k
        assert [s.score for s in ranked] == sorted((s.score for s in ranked), reverse=True)
        assert len(set(_texts(ranked))) == len(ranked)
        assert all(any(s is c for c in candidates) for s in ranked)


def test_chunk_that_does_not_fit_is_skipped_for_a_smaller_one() -> None:
    candidates = [
        make_scored("first", score=0.9, tokens=60, url="https://a.example", vector=one_hot(0)),
        make_scored("second", score=0.8, tokens=50, url="https://b.example", vector=one_hot(1)),
        make_scored("third", score=0.7, tokens=40, url="https://c.example", vector=one_hot(2)),
    ]
    ranked = rank_chunks(candidates, top_k=10, token_budget=100)
    assert _texts(ranked) == ["first", "third"]


def test_same_text_on_several_sites_counts_once() -> None:
    text = "Redis keeps the queue in memory."
    candidates = [
        make_scored(text, score=0.9, url="https://a.example", vector=one_hot(0)),
        make_scored(f"  {text.upper()}\n", score=0.8, url="https://b.example", vector=one_hot(1)),
        make_scored("Something else.", score=0.7, url="https://c.example", vector=one_hot(2)),
    ]
    ranked = rank_chunks(candidates, top_k=10, token_budget=1000)
    assert [s.url for s in ranked] == ["https://a.example", "https://c.example"]


def _two_wordings_and_another() -> list[ScoredChunk]:
    """Two wordings whose vectors are near-identical (cosine > 0.99), then another topic."""
    almost = [1.0, 0.01] + [0.0] * 62
    return [
        make_scored("Wording one.", score=0.9, url="https://a.example", vector=one_hot(0)),
        make_scored("Wording two.", score=0.8, url="https://b.example", vector=almost),
        make_scored("Other topic.", score=0.7, url="https://c.example", vector=one_hot(1)),
    ]


def test_near_identical_vector_counts_as_duplicate() -> None:
    candidates = _two_wordings_and_another()
    ranked = rank_chunks(candidates, top_k=10, token_budget=1000, dedup_threshold=0.95)
    assert _texts(ranked) == ["Wording one.", "Other topic."]


def test_candidates_searched_without_vectors_are_deduplicated_by_looked_up_ones() -> None:
    full = _two_wordings_and_another()
    stored = {c.chunk.text: c.vector for c in full}
    bare = [c.model_copy(update={"vector": []}) for c in full]
    asked: list[list[str]] = []

    def lookup(hits: Sequence[ScoredChunk]) -> list[list[float]]:
        asked.append([h.chunk.text for h in hits])
        return [stored[h.chunk.text] for h in hits]

    ranked = rank_chunks(bare, top_k=10, token_budget=1000, vectors=lookup)
    assert _texts(ranked) == ["Wording one.", "Other topic."]
    assert asked == [["Wording one.", "Wording two.", "Other topic."]]  # one window
    # Without a lookup there is nothing to compare: both wordings stay.
    assert len(rank_chunks(bare, top_k=10, token_budget=1000)) == 3


def test_vectors_are_looked_up_only_as_far_as_the_picker_reads() -> None:
    candidates = [
        make_scored(
            f"Passage {i}.", score=1 - i / 1000, url=f"https://s{i}.example", tokens=10, vector=[]
        )
        for i in range(VECTOR_WINDOW * 3)
    ]
    asked: list[int] = []

    def lookup(hits: Sequence[ScoredChunk]) -> list[list[float]]:
        asked.append(len(hits))
        return [one_hot(int(h.chunk.text.split()[1].rstrip(".")) % 64) for h in hits]

    # A token budget that 5 chunks fill: only the first window is ever fetched.
    ranked = rank_chunks(candidates, top_k=10, token_budget=50, vectors=lookup)
    assert len(ranked) == 5 and asked == [VECTOR_WINDOW]
    # A lookup that finds nothing (points deleted meanwhile) skips the check only.
    assert len(rank_chunks(candidates, top_k=3, token_budget=1000,
                           vectors=lambda hits: [[] for _ in hits])) == 3  # fmt: skip


def test_candidates_built_with_array_vectors_are_ranked() -> None:
    # Benchmarks build candidates with model_construct and numpy vectors.
    candidates = [
        ScoredChunk.model_construct(**{**c.__dict__, "vector": np.asarray(c.vector)})
        for c in _two_wordings_and_another()
    ]
    ranked = rank_chunks(candidates, top_k=10, token_budget=1000, vectors=lambda hits: [])
    assert _texts(ranked) == ["Wording one.", "Other topic."]


def test_overlapping_windows_of_one_page_are_dropped() -> None:
    page = make_page(text="".join(f"Sentence number {i}. " for i in range(30)))
    best = make_scored(page=page, start=100, end=200, score=0.9, vector=one_hot(0))
    overlapping = make_scored(page=page, start=60, end=160, score=0.8, vector=one_hot(1))
    adjacent = make_scored(page=page, start=0, end=100, score=0.7, vector=one_hot(2))
    ranked = rank_chunks([adjacent, overlapping, best], top_k=10, token_budget=1000)
    assert [(s.chunk.start, s.chunk.end) for s in ranked] == [(100, 200), (0, 100)]


def test_same_offsets_on_different_pages_do_not_overlap() -> None:
    first = make_scored("Shared words here.", url="https://a.example", vector=one_hot(0))
    second = make_scored("Other words there.", url="https://b.example", vector=one_hot(1))
    assert len(rank_chunks([first, second], top_k=10, token_budget=1000)) == 2


def test_per_source_cap_limits_chunks_from_one_url() -> None:
    candidates = [
        make_scored(f"A{i}", score=0.9 - i / 100, url="https://a.example", vector=one_hot(i))
        for i in range(5)
    ] + [
        make_scored(f"B{i}", score=0.5 - i / 100, url="https://b.example", vector=one_hot(10 + i))
        for i in range(2)
    ]
    ranked = rank_chunks(candidates, top_k=4, token_budget=1000, per_source_cap=2)
    assert _texts(ranked) == ["A0", "A1", "B0", "B1"]


def test_per_source_cap_is_relaxed_when_nothing_else_is_left() -> None:
    candidates = [
        make_scored(f"A{i}", score=0.9 - i / 100, url="https://a.example", vector=one_hot(i))
        for i in range(5)
    ] + [make_scored("B0", score=0.1, url="https://b.example", vector=one_hot(10))]
    ranked = rank_chunks(candidates, top_k=4, token_budget=1000, per_source_cap=2)
    assert _texts(ranked) == ["A0", "A1", "A2", "B0"]


def test_default_has_no_per_source_cap_so_a_strong_source_keeps_its_chunks() -> None:
    # bench/answer_recall.py: with a cap of 3, the fourth passage of the page holding the
    # answer waited behind every other page's weakest chunks (1,000 tokens: 0.905 -> 0.965).
    candidates = [
        make_scored(f"A{i}", score=0.9 - i / 100, url="https://a.example", vector=one_hot(i))
        for i in range(5)
    ] + [
        make_scored(f"B{i}", score=0.1 - i / 100, url="https://b.example", vector=one_hot(10 + i))
        for i in range(3)
    ]
    ranked = rank_chunks(candidates, top_k=5, token_budget=1000)
    assert _texts(ranked) == ["A0", "A1", "A2", "A3", "A4"]


def test_budget_binds_before_top_k_and_is_never_exceeded_without_a_cap() -> None:
    candidates = [
        make_scored(f"C{i}", score=1 - i / 100, tokens=64, url="https://a.example",
                    vector=one_hot(i))  # fmt: skip
        for i in range(40)
    ]
    for budget in (63, 64, 250, 500, 1000):
        ranked = rank_chunks(candidates, top_k=200, token_budget=budget, per_source_cap=None)
        assert sum(s.chunk.tokens for s in ranked) <= budget
        assert len(ranked) == min(budget // 64, 40)


def test_per_source_cap_must_be_positive_or_none() -> None:
    with pytest.raises(ValueError, match="per_source_cap"):
        rank_chunks([make_scored()], top_k=1, token_budget=100, per_source_cap=0)


def test_top_k_limits_the_selection_to_the_best() -> None:
    candidates = [
        make_scored(f"T{i}", score=i / 10, url=f"https://{i}.example", vector=one_hot(i))
        for i in range(8)
    ]
    ranked = rank_chunks(candidates, top_k=3, token_budget=1000)
    assert _texts(ranked) == ["T7", "T6", "T5"]


@pytest.mark.parametrize(("top_k", "budget"), [(0, 1000), (5, 0), (-1, -1)])
def test_no_room_selects_nothing(top_k: int, budget: int) -> None:
    assert rank_chunks([make_scored()], top_k=top_k, token_budget=budget) == []


def test_cosine_of_simple_vectors() -> None:
    assert cosine([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 3.0]) == pytest.approx(0.0)
    assert cosine([1.0, 1.0], [-1.0, -1.0]) == pytest.approx(-1.0)
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0
    assert cosine([1.0], [1.0, 0.0]) == 0.0


def test_bm25_prefers_rare_question_terms_and_ignores_case() -> None:
    texts = ["The treaty was signed in Utrecht in 1713.", "The war ended.", "The the the."]
    scores = bm25_scores("Where was the TREATY signed?", texts)
    assert scores[0] > scores[1] > 0.0
    assert scores[0] > scores[2]
    assert bm25_scores("anything", []) == []


def test_bm25_takes_a_texts_counts_given_ahead_instead_of_counting_it() -> None:
    question = "Where was the TREATY signed?"
    texts = ["The treaty was signed in Utrecht in 1713.", "The war ended.", "The the the."]
    terms = query_terms(question)
    ahead = {t: term_counts(t, terms) for t in texts[:2]}
    assert bm25_scores(question, texts, counted=ahead) == bm25_scores(question, texts)
    # Counts given for the war's text are what BM25 reads of it: now it names the treaty.
    told = {texts[1]: (3, {"treaty": 1, "signed": 1})}
    plain, scores = bm25_scores(question, texts), bm25_scores(question, texts, counted=told)
    assert scores[1] > 3 * plain[1] > 0.0


def test_rrf_adds_reciprocal_ranks_and_tied_scores_share_a_rank() -> None:
    by_score = [ranks_by_score([0.9, 0.5, 0.1]), ranks_by_score([0.0, 2.0, 2.0])]
    assert by_score[1] == {1: 1, 2: 1, 0: 3}
    fused = rrf(by_score, k=60)
    assert [fused[i] for i in range(3)] == pytest.approx(
        [1 / 61 + 1 / 63, 1 / 62 + 1 / 61, 1 / 63 + 1 / 61]
    )
    assert rrf([], k=60) == {}


def test_rrf_of_id_lists_counts_an_id_each_list_places_and_keeps_first_met_order() -> None:
    fused = rrf([ranks_in_order(["a", "b"]), ranks_in_order(["c", "a"])], k=60)
    assert list(fused) == ["a", "b", "c"]
    assert fused == pytest.approx({"a": 1 / 61 + 1 / 62, "b": 1 / 62, "c": 1 / 61})


def test_rrf_weights_each_ranking() -> None:
    rankings = [ranks_by_score([0.9, 0.5]), ranks_by_score([0.1, 0.7])]
    fused = rrf(rankings, k=10, weights=[1.0, 0.5])
    assert [fused[0], fused[1]] == pytest.approx([1 / 11 + 0.5 / 12, 1 / 12 + 0.5 / 11])
    with pytest.raises(ValueError, match="weight"):
        rrf(rankings, k=10, weights=[1.0])


def test_fusion_lifts_the_chunk_that_spells_out_the_questions_terms() -> None:
    # Dense ranks the paraphrase first; the exact-term chunk is second by cosine but first
    # by BM25, and fusion puts it on top: at a tight budget it is the one kept.
    question = "In which year did Fermat state his last theorem?"
    paraphrase = make_scored("A famous conjecture about powers of integers.", score=0.80,
                             tokens=10, url="https://a.example", vector=one_hot(0))  # fmt: skip
    exact = make_scored("Fermat stated the last theorem in the year 1637.", score=0.78,
                        tokens=10, url="https://b.example", vector=one_hot(1))  # fmt: skip
    filler = [
        make_scored(
            f"Unrelated passage {i} about the year of cooking.",
            score=0.5 - i / 100,
            tokens=10,
            url=f"https://c{i}.example",
            vector=one_hot(2 + i),
        )  # fmt: skip
        for i in range(3)
    ]
    fused = fuse_lexical(question, [paraphrase, exact, *filler])
    ranked = rank_chunks(fused, top_k=10, token_budget=10)
    assert _texts(ranked) == [exact.chunk.text]
    assert [c.chunk.text for c in fused] == [c.chunk.text for c in [paraphrase, exact, *filler]]
