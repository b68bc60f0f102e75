"""The embed -> store hand-off: staged chunk spans and vectors in Redis (fakeredis)."""

from __future__ import annotations

import fakeredis
import numpy as np
import pytest

from tests.factories import make_page
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.adapters.memory_store import MemoryVectorStore
from webctx.jobs.staging import ChunkStaging
from webctx.settings import ChunkSettings, EmbedSettings
from webctx.stages.chunk import chunk_page
from webctx.stages.compose import EmbeddedPage, IndexOutcome, embed_page, index_page, store_page

TEXT = " ".join(f"Sentence number {i} is about narwhal tusks and sea ice." for i in range(60))


def _staging(scope: str = "s1") -> ChunkStaging:
    return ChunkStaging(fakeredis.FakeRedis(), scope=scope, ttl_s=60)


def test_staged_chunks_come_back_identical_to_what_the_embed_stage_made() -> None:
    page = make_page(text=TEXT)
    chunks = chunk_page(page, max_tokens=64, overlap_tokens=8)
    vectors = HashEmbedder().vectors([c.text for c in chunks])
    staging = _staging()
    staging.put(chunks, vectors)

    staged = staging.get(page.content_sha256)
    assert staged is not None
    assert staged.chunks(page) == chunks
    expected = np.asarray(vectors, dtype=np.float32)
    assert np.array_equal(staged.vectors, expected)


def test_staging_expires_and_is_dropped_once_stored() -> None:
    page = make_page(text=TEXT)
    chunks = chunk_page(page, max_tokens=64, overlap_tokens=8)
    staging = _staging()
    staging.put(chunks, [[1.0, 0.0]] * len(chunks))
    key = f"webctx:staged:s1:{page.content_sha256}"
    assert 0 < staging._redis.ttl(key) <= 60
    staging.drop(page.content_sha256)
    assert staging.get(page.content_sha256) is None


def test_another_index_scope_does_not_see_the_staged_page() -> None:
    client = fakeredis.FakeRedis()
    page = make_page(text=TEXT)
    chunks = chunk_page(page, max_tokens=64, overlap_tokens=8)
    ChunkStaging(client, scope="model-a", ttl_s=60).put(chunks, [[1.0]] * len(chunks))
    assert ChunkStaging(client, scope="model-b", ttl_s=60).get(page.content_sha256) is None


def test_a_torn_entry_reads_as_missing_not_as_wrong_vectors() -> None:
    page = make_page(text=TEXT)
    chunks = chunk_page(page, max_tokens=64, overlap_tokens=8)
    staging = _staging()
    staging.put(chunks, [[1.0, 2.0]] * len(chunks))
    key = f"webctx:staged:s1:{page.content_sha256}"
    staging._redis.hset(key, "vectors", b"\x00" * 12)  # not len(spans) x dim float32s
    assert staging.get(page.content_sha256) is None


@pytest.mark.parametrize(
    ("vectors", "message"),
    [([[1.0]], "chunks but"), ("ragged", "same dimension")],
)
def test_staging_refuses_vectors_that_do_not_match_the_chunks(
    vectors: object, message: str
) -> None:
    page = make_page(text=TEXT)
    chunks = chunk_page(page, max_tokens=64, overlap_tokens=8)
    if vectors == "ragged":
        vectors = [[1.0, 2.0]] * (len(chunks) - 1) + [[1.0]]
    with pytest.raises(ValueError, match=message):
        _staging().put(chunks, vectors)  # type: ignore[arg-type]


def test_staging_refuses_chunks_of_two_pages() -> None:
    a = chunk_page(make_page(text=TEXT), max_tokens=64, overlap_tokens=8)
    b = chunk_page(make_page(text=TEXT + " More."), max_tokens=64, overlap_tokens=8)
    with pytest.raises(ValueError, match="one page"):
        _staging().put(a[:1] + b[:1], [[1.0], [1.0]])


def test_embed_then_store_writes_the_same_points_as_index_page() -> None:
    page = make_page(text=TEXT)
    embedder = HashEmbedder()
    chunking, embedding = ChunkSettings(), EmbedSettings()
    one_step = MemoryVectorStore()
    index_page(page, embedder=embedder, store=one_step, chunking=chunking, embedding=embedding)

    embedded = embed_page(page, embedder=embedder, chunking=chunking, embedding=embedding)
    staging = _staging()
    staging.put(embedded.chunks, embedded.vectors)
    staged = staging.get(page.content_sha256)
    assert staged is not None
    two_steps = MemoryVectorStore()
    rebuilt = EmbeddedPage(staged.chunks(page), staged.vectors.tolist(), IndexOutcome(0, 0, 0))
    written = store_page(rebuilt, store=two_steps, url=page.final_url, model=embedder.model)

    assert written == len(embedded.chunks) > 1
    query = embedder.embed(["narwhal tusks"]).vectors[0]

    def stored(store: MemoryVectorStore) -> dict[tuple[int, int], tuple[object, list[float]]]:
        hits = store.search(query, limit=1000, content_sha256s=[page.content_sha256])
        return {(h.chunk.start, h.chunk.end): (h.chunk, h.vector) for h in hits}

    a, b = stored(one_step), stored(two_steps)
    assert a.keys() == b.keys() and len(a) == written
    for span, (chunk, vector) in a.items():
        assert b[span][0] == chunk
        assert np.allclose(b[span][1], vector, atol=1e-6)  # float32 in transit
