"""The lexical first pass: which chunks a one-off job embeds before its bundle."""

from __future__ import annotations

import pytest

from tests.factories import make_page
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.models import BundleStats, Chunk, Page
from webctx.settings import ChunkSettings, EmbedSettings, PrefilterSettings
from webctx.stages.bundle import validate_offsets
from webctx.stages.chunk import chunk_page
from webctx.stages.compose import answer_prefiltered, prefilter_candidates
from webctx.stages.prefilter import select_candidates

_FILLER = "The committee met in the hall and talked about the weather for a while."


def _chunk(page: str, index: int, text: str) -> Chunk:
    return Chunk(content_sha256=page, index=index, start=0, end=len(text), text=text, tokens=8)


def _chunks() -> list[Chunk]:
    """Page a: the question's words in chunk 2; page b: none of them."""
    a = [_chunk("a", i, _FILLER) for i in range(5)]
    a[2] = _chunk("a", 2, "The glacier retreated in 1850 after the little ice age.")
    b = [_chunk("b", i, f"{_FILLER} Item {i}.") for i in range(4)]
    return a + b


def test_the_best_bm25_chunks_are_selected_and_the_rest_deferred() -> None:
    chunks = _chunks()
    found = select_candidates("when did the glacier retreat", chunks, limit=1)
    assert found.selected == [2]
    assert found.deferred == [i for i in range(len(chunks)) if i != 2]
    assert found.scores[2] == max(found.scores)


def test_each_page_keeps_its_best_chunks_even_without_the_question_s_words() -> None:
    chunks = _chunks()
    found = select_candidates("glacier", chunks, limit=1, per_page=1)
    pages = {chunks[i].content_sha256 for i in found.selected}
    assert pages == {"a", "b"}
    assert len(found.selected) == 2


def test_the_neighbours_of_the_best_hits_on_the_same_page_are_selected() -> None:
    chunks = _chunks()
    found = select_candidates("glacier", chunks, limit=1, neighbours=1)
    assert found.selected == [1, 2, 3]  # a's chunks 1 and 3 around the hit, nothing of b


def test_a_limit_above_the_chunk_count_selects_everything() -> None:
    chunks = _chunks()
    found = select_candidates("glacier", chunks, limit=1000)
    assert found.selected == list(range(len(chunks))) and found.deferred == []


def test_the_selection_is_deterministic_when_scores_tie() -> None:
    chunks = _chunks()
    first = select_candidates("nothing matches", chunks, limit=3)
    assert first.selected == [0, 1, 2]  # all score 0: the earliest go first
    assert select_candidates("nothing matches", chunks, limit=3) == first


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        select_candidates("glacier", _chunks(), limit=-1)


def _pages() -> dict[str, Page]:
    texts = {
        "https://a.example/": "\n\n".join(f"The harbour record {i} notes ships." for i in range(40))
        + "\n\nThe glacier retreated in 1850, the record says.",
        "https://b.example/": "\n\n".join(
            f"The orchard record {i} notes apples." for i in range(40)
        ),
    }
    pages = [make_page(url=url, text=text) for url, text in texts.items()]
    return {p.content_sha256: p for p in pages}


def test_only_the_selected_chunks_and_the_question_are_embedded() -> None:
    pages, stats = _pages(), BundleStats()
    size = ChunkSettings().max_tokens
    total = sum(len(chunk_page(p, max_tokens=size, overlap_tokens=0)) for p in pages.values())
    found = prefilter_candidates(
        question="when did the glacier retreat?", pages=pages, stats=stats,
        embedder=HashEmbedder(), chunking=ChunkSettings(), embedding=EmbedSettings(),
        prefilter=PrefilterSettings(chunks=2, per_page=0, neighbours=0),
    )  # fmt: skip
    assert len(found.candidates) == 2 and found.deferred == total - 2
    assert stats.chunks == total
    assert all(c.vector for c in found.candidates)
    assert "glacier" in max(found.candidates, key=lambda c: c.score).chunk.text


def test_a_prefiltered_bundle_cites_exact_spans_of_its_pages() -> None:
    pages = _pages()
    bundle = answer_prefiltered(
        job_id="j", question="when did the glacier retreat?", queries=["glacier"],
        pages=pages, failures=[], stats=BundleStats(), embedder=HashEmbedder(), top_k=5,
        token_budget=200, chunking=ChunkSettings(), embedding=EmbedSettings(),
        prefilter=PrefilterSettings(chunks=8),
    )  # fmt: skip
    assert bundle.chunks and "1850" in bundle.chunks[0].text
    assert validate_offsets(bundle, pages) == []
