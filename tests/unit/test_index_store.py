"""The index's roles of the vector store (IndexWriter, IndexReader, and Optimizable where
the engine needs it), run on every backend: in memory, the embedded engine, and
qdrant-client in memory (the server's API)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.factories import make_page
from webctx.adapters.edge_store import EdgeVectorStore
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.index.generations import tenant_key
from webctx.models import Chunk, Page, StoredChunk
from webctx.protocols import IndexReader, IndexScope, IndexStore, IndexWriter, Optimizable
from webctx.stages.store import make_points

TK = tenant_key("acme.co")  # a dot: payload keys must not read it as nesting
EMBEDDER = HashEmbedder()

# Qdrant's local mode warns that payload indexes are no-ops there; servers use them.
pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect")


def page_points(page: Page, texts: list[str] | None = None) -> list[StoredChunk]:
    """The page's chunks (its title's words by default), dense vectors by feature hashing."""
    texts = texts or [f"{page.title} words {i}" for i in range(3)]
    chunks = [Chunk(content_sha256=page.content_sha256, index=i, start=i, end=i + 1, text=t,
                    tokens=len(t.split())) for i, t in enumerate(texts)]  # fmt: skip
    return make_points(chunks, EMBEDDER.vectors(texts), url=page.url, model="hash-embedding")


def store_page(store: IndexStore, page: Page, texts: list[str] | None = None) -> None:
    """Dense and sparse points of a page, as a re-index run writes them (unmarked)."""
    points = page_points(page, texts)
    store.upsert(points)
    store.upsert_sparse(points)


def live_pages(store: IndexReader, scope: IndexScope, query: str = "words 1") -> set[str]:
    """The pages both rankings reach within `scope` (they must agree)."""
    vector = EMBEDDER.vectors([query])[0]
    dense = store.retrieve(store.rank_live(vector, limit=20, scope=scope))
    sparse = store.retrieve(store.rank_live_sparse("words", limit=20, scope=scope))
    pages = {p.chunk.content_sha256 for p in dense.values()}
    assert pages == {p.chunk.content_sha256 for p in sparse.values()}
    return pages


def test_every_backend_plays_every_index_role(index_store: IndexStore) -> None:
    assert isinstance(index_store, IndexWriter) and isinstance(index_store, IndexReader)
    assert isinstance(index_store, Optimizable) == isinstance(index_store, EdgeVectorStore)


def test_marks_make_pages_live_and_dead_by_generation(index_store: IndexStore) -> None:
    a = make_page(url="https://a.test/", text="alpha", title="alpha", site="A.test")
    b = make_page(url="https://b.test/", text="beta", title="beta", site="b.test")
    for page in (a, b):
        store_page(index_store, page)

    def found(generation: int, **kw: object) -> set[str]:
        return live_pages(index_store, IndexScope(TK, generation, **kw))  # type: ignore[arg-type]

    assert found(5) == set()  # stored, never marked: invisible
    index_store.mark_pages(tenant_key=TK, generation=1, live={a.content_sha256: "a.test"}, dead=[])
    assert found(0) == set() and found(1) == {a.content_sha256}
    index_store.mark_pages(tenant_key=TK, generation=2, live={b.content_sha256: "b.test"},
                           dead=[a.content_sha256])  # fmt: skip
    assert found(1) == {a.content_sha256}  # a searcher still at 1 sees the old page only
    assert found(2) == {b.content_sha256}
    assert found(2, site="b.test") == {b.content_sha256} and found(2, site="a.test") == set()
    assert found(2, content_sha256s=[a.content_sha256]) == set()
    assert found(2, content_sha256s=[]) == set()
    assert live_pages(index_store, IndexScope("0" * 16, 2)) == set()  # another tenant
    index_store.mark_pages(tenant_key=TK, generation=3, live={a.content_sha256: "a.test"}, dead=[])
    assert found(3) == {a.content_sha256, b.content_sha256}  # revived: its `until` cleared
    store_page(index_store, a)  # a research job stores the same content-addressed points
    assert found(3) == {a.content_sha256, b.content_sha256}  # the marks survive


def test_ranks_are_point_ids_best_first_and_retrieve_reads_only_those(
    index_store: IndexStore,
) -> None:
    pages = [make_page(url=f"https://s.test/{i}", text=f"text {i}", title=f"t{i}")
             for i in range(3)]  # fmt: skip
    points = {p.id: p for page in pages for p in page_points(page)}
    for page in pages:
        store_page(index_store, page)
    index_store.mark_pages(tenant_key=TK, generation=1, dead=[],
                           live={p.content_sha256: "s.test" for p in pages})  # fmt: skip
    scope, vector = IndexScope(TK, 1), EMBEDDER.vectors(["t1 words 2"])[0]
    dense = index_store.rank_live(vector, limit=4, scope=scope)
    # In the cosine order a job's search gives among the same pages (all live here).
    key = {pid: (p.chunk.content_sha256, p.chunk.start) for pid, p in points.items()}
    hits = index_store.search(vector, limit=4, content_sha256s=[p.content_sha256 for p in pages])
    assert [key[pid] for pid in dense] == [(h.chunk.content_sha256, h.chunk.start) for h in hits]
    sparse = index_store.rank_live_sparse("t1 words", limit=4, scope=scope)
    assert len(sparse) == 4 and points[sparse[0]].chunk.text.startswith("t1 words")
    assert index_store.rank_live(vector, limit=4, scope=IndexScope(TK, 0)) == []
    assert index_store.rank_live_sparse("t1", limit=4, scope=IndexScope(TK, 1, site="x")) == []
    gone = "00000000-0000-5000-8000-000000000000"
    got = index_store.retrieve([dense[0], sparse[0], gone])
    assert set(got) == {dense[0], sparse[0]}
    for pid, point in got.items():
        assert point.model_dump() == points[pid].model_copy(update={"vector": []}).model_dump()
    assert index_store.retrieve([]) == {}


def test_sparse_ranking_favours_rare_words_and_deleted_pages_leave_both_halves(
    index_store: IndexStore,
) -> None:
    a = make_page(url="https://a.test/", text="a")
    b = make_page(url="https://b.test/", text="b")
    store_page(index_store, a, ["the quick brown fox", "lazy dogs sleep all day"])
    store_page(index_store, b, ["the brown bear eats honey", "the end of the story"])
    live = {a.content_sha256: "a.test", b.content_sha256: "b.test"}
    index_store.mark_pages(tenant_key=TK, generation=1, live=live, dead=[])
    scope = IndexScope(TK, 1)

    def texts(query: str, where: IndexScope = scope) -> list[str]:
        ranked = index_store.rank_live_sparse(query, limit=5, scope=where)
        found = index_store.retrieve(ranked)
        return [found[pid].chunk.text for pid in ranked]

    assert texts("honey bear")[0] == "the brown bear eats honey"
    only_a = IndexScope(TK, 1, content_sha256s=[a.content_sha256])
    assert texts("the brown", only_a) == ["the quick brown fox"]
    assert texts("") == []
    index_store.delete_pages([a.content_sha256])
    assert index_store.count() == 2
    assert texts("fox") == []
    assert index_store.search([1.0] * 256, limit=5, content_sha256s=[a.content_sha256]) == []
    assert index_store.retrieve([p.id for p in page_points(a)]) == {}


def test_the_embedded_engine_builds_its_graphs_only_when_asked(tmp_path: Path) -> None:
    with EdgeVectorStore(tmp_path / "edge") as store:
        assert store.unindexed() == 0 and store.optimize() is False  # nothing stored
        store_page(store, make_page())
        assert store.unindexed() == 3  # searched by brute force until optimized
        store.optimize()
