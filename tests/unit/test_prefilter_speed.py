"""The first pass sized to the local model's speed: a slow CPU embeds the pass's best
chunks within the budget, a fast one the whole pass, and chunks embedded ahead are free."""

from __future__ import annotations

import pytest
import redis

from tests.conftest import redis_url
from tests.factories import make_page
from webctx.adapters.embed_speed import MIN_TEXTS, EmbedSpeed
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.jobs.embed_cache import RedisEmbeddingCache
from webctx.models import BundleStats, Chunk, Page
from webctx.settings import ChunkSettings, EmbedSettings, PrefilterSettings
from webctx.stages.chunk import chunk_page
from webctx.stages.compose import fit_to_speed, prefilter_candidates
from webctx.stages.prefilter import narrow_pass, select_candidates

QUESTION = "when did the glacier retreat from the valley?"


def _pages() -> dict[str, Page]:
    """Four pages of 40 paragraphs; each names the glacier now and then, one the answer."""
    pages = []
    for p in range(4):
        paragraphs = [
            f"Record {p}.{i}: the glacier stood still" if i % 5 == 0
            else f"Record {p}.{i}: the harbour held {i} ships and the tides were calm"
            for i in range(40)
        ]  # fmt: skip
        if p == 2:
            paragraphs[17] = "The glacier retreated from the valley in 1850, the survey says."
        pages.append(make_page(url=f"https://{p}.example/", text="\n\n".join(paragraphs)))
    return {page.content_sha256: page for page in pages}


def _chunks(pages: dict[str, Page]) -> list[Chunk]:
    return [c for p in pages.values() for c in chunk_page(p, max_tokens=16, overlap_tokens=0)]


def _candidates(chunks_per_s: float | None, prefilter: PrefilterSettings,
                cache: RedisEmbeddingCache | None = None) -> tuple[list[str], int]:  # fmt: skip
    stats = BundleStats()
    found = prefilter_candidates(
        question=QUESTION, pages=_pages(), stats=stats, embedder=HashEmbedder(),
        chunking=ChunkSettings(max_tokens=16), embedding=EmbedSettings(), prefilter=prefilter,
        cache=cache, chunks_per_s=chunks_per_s,
    )  # fmt: skip
    ranked = sorted(found.candidates, key=lambda c: -c.score)
    return [c.chunk.text for c in ranked], stats.embedded_at_rank


PASS = PrefilterSettings(chunks=40, per_page=8, neighbours=16, embed_budget_s=1.0, min_chunks=4)


def test_a_model_fast_enough_for_the_whole_pass_embeds_all_of_it() -> None:
    whole, embedded = _candidates(None, PASS)
    assert _candidates(1000.0, PASS) == (whole, embedded)
    assert embedded == len(whole) + 1  # and the question


def test_a_slow_model_embeds_the_best_of_the_pass_within_its_budget() -> None:
    whole, _ = _candidates(None, PASS)
    narrow, embedded = _candidates(12.0, PASS)  # 12 chunks a second, 1 s: 12 chunks
    assert len(narrow) <= 12 < len(whole)
    assert embedded == len(narrow) + 1
    assert set(narrow) < set(whole)
    assert "1850" in narrow[0] and "1850" in whole[0]


def test_however_slow_the_model_the_pass_keeps_min_chunks() -> None:
    narrow, _ = _candidates(0.5, PASS)
    assert 0 < len(narrow) <= PASS.min_chunks
    # the knobs scale down together: no scale keeps exactly 4 here, the largest under it
    assert len(narrow) >= 2


def test_no_budget_never_narrows() -> None:
    unbounded = PASS.model_copy(update={"embed_budget_s": 0.0})
    assert _candidates(0.5, unbounded) == _candidates(None, unbounded)


def test_narrowing_scales_every_knob_and_keeps_what_was_embedded_ahead() -> None:
    chunks = _chunks(_pages())
    full = select_candidates(QUESTION, chunks, limit=40, per_page=8, neighbours=16)
    ahead = set(full.selected[-10:])  # embedded while pages downloaded: free
    narrow = narrow_pass(full, chunks, limit=40, per_page=8, neighbours=16, affordable=12,
                         embedded=ahead)  # fmt: skip
    fresh = [i for i in narrow.selected if i not in ahead]
    assert len(fresh) <= 12 and ahead <= set(narrow.selected) <= set(full.selected)
    assert sorted(narrow.selected + narrow.deferred) == list(range(len(chunks)))
    half = select_candidates(QUESTION, chunks, limit=20, per_page=4, neighbours=8)
    assert set(fresh) <= set(half.selected) | set(full.selected)
    assert narrow_pass(full, chunks, limit=40, per_page=8, neighbours=16,
                       affordable=len(full.selected)) is full  # fmt: skip


def test_chunks_in_the_embedding_cache_do_not_count_against_the_budget(
    redis_client: redis.Redis,
) -> None:
    cache = RedisEmbeddingCache(redis.Redis.from_url(redis_url()))
    whole, _ = _candidates(None, PASS, cache)  # every chunk of the pass is in the cache now
    again, embedded = _candidates(12.0, PASS, cache)
    assert set(again) == set(whole) and embedded == 0  # (ties may order float32 hits apart)


def test_fit_to_speed_asks_the_cache_only_when_the_pass_is_too_big() -> None:
    chunks = _chunks(_pages())
    full = select_candidates(QUESTION, chunks, limit=40, per_page=8, neighbours=16)
    asked: list[int] = []

    def embedded(texts: list[str]) -> set[int]:
        asked.append(len(texts))
        return set()

    assert fit_to_speed(full, chunks, prefilter=PASS, chunks_per_s=1000.0,
                        embedded=embedded) is full  # fmt: skip
    assert asked == []
    fit_to_speed(full, chunks, prefilter=PASS, chunks_per_s=12.0, embedded=embedded)
    assert asked == [len(full.selected)]


def test_embed_speed_is_a_weighted_mean_of_the_calls_worth_measuring() -> None:
    speed = EmbedSpeed(weight=0.5)
    assert speed.chunks_per_s is None
    speed.observe(MIN_TEXTS - 1, 0.001)  # a question alone: its fixed cost, not the speed
    assert speed.chunks_per_s is None
    speed.observe(100, 1.0)
    assert speed.chunks_per_s == 100.0
    speed.observe(100, 0.5)  # then 200 a second: halfway, with weight 0.5
    assert speed.chunks_per_s == pytest.approx(150.0)
    with pytest.raises(RuntimeError), speed.timing(50):
        raise RuntimeError("a failed call measures nothing")
    assert speed.chunks_per_s == pytest.approx(150.0)
