"""Generations: what a tenant's index search sees, and the commit protocol that moves it.

The page records run on the test Redis db, the store is the memory backend (the marks
themselves are each backend's contract: test_index_store.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import redis

from tests.conftest import redis_url
from tests.factories import make_page
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.adapters.memory_store import MemoryVectorStore
from webctx.index.generations import Change, Commit, tenant_key
from webctx.index.page_records import PageRecord, PageRecords
from webctx.index.refresh import IndexContext
from webctx.index.search import search_index
from webctx.jobs.caches import StoredPages
from webctx.models import Chunk, Page, StoredChunk
from webctx.protocols import IndexStore
from webctx.settings import ChunkSettings, EmbedSettings, IndexSettings
from webctx.stages.store import make_points

TENANT = "acme.co"  # a dot: payload keys must not read it as nesting
TK = tenant_key(TENANT)


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def page_points(page: Page, n: int = 3) -> list[StoredChunk]:
    chunks = [Chunk(content_sha256=page.content_sha256, index=i, start=i, end=i + 1,
                    text=f"{page.title} words {i}", tokens=3) for i in range(n)]  # fmt: skip
    vectors = HashEmbedder().vectors([c.text for c in chunks])
    return make_points(chunks, vectors, url=page.url, model="hash-embedding")


def store_page(store: IndexStore, page: Page) -> None:
    points = page_points(page)
    store.upsert(points)
    store.upsert_sparse(points)


def record_of(page: Page, url: str | None = None) -> PageRecord:
    now = time.time()
    return PageRecord(url=url or page.url, source_id="s", content_sha256=page.content_sha256,
                       model="hash-embedding", fetched_at=now, changed_at=now,
                       title=page.title, site=page.site)  # fmt: skip


def ctx_for(r: redis.Redis, store: IndexStore) -> IndexContext:
    return IndexContext(records=PageRecords(r), stored_pages=StoredPages(r, ttl_s=60, scope=["s"]),
                        fetcher=None,  # type: ignore[arg-type]
                        embedder=HashEmbedder(model="hash-embedding"), store=store,
                        chunking=ChunkSettings(), embedding=EmbedSettings(),
                        settings=IndexSettings(grace_s=60.0))  # fmt: skip


def seen_hashes(ctx: IndexContext, query: str = "words") -> set[str]:
    return {h.content_sha256 for h in search_index(query, tenant=TENANT, ctx=ctx, limit=200)}


# -- the commit protocol ----------------------------------------------------------------------
def test_unfiltered_search_never_lists_the_tenants_pages(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryVectorStore()
    ctx = ctx_for(r, store)
    pages = [make_page(url=f"https://s.test/{i}", text=f"text {i}", title=f"t{i}")
             for i in range(5)]  # fmt: skip
    for page in pages:
        store_page(store, page)
        ctx.records.commit(TENANT, page.url, store=store, record=record_of(page), page=page,
                         grace_s=60.0)  # fmt: skip

    def listed(*args: object, **kwargs: object) -> None:
        raise AssertionError("an unfiltered search read every page record")

    monkeypatch.setattr(PageRecords, "pages", listed)
    hits = search_index("words", tenant=TENANT, ctx=ctx, limit=50)
    assert {h.content_sha256 for h in hits} == {p.content_sha256 for p in pages}
    assert {h.url for h in hits} == {p.url for p in pages} and all(h.source_id for h in hits)


def test_a_commit_left_half_done_is_replayed_and_never_surfaces_early(r: redis.Redis) -> None:
    store = MemoryVectorStore()
    ctx = ctx_for(r, store)
    old = make_page(url="https://s.test/p", text="old text", title="old")
    new = make_page(url="https://s.test/p", text="new text", title="new")
    store_page(store, old)
    ctx.records.commit(TENANT, old.url, store=store, record=record_of(old), page=old, grace_s=60)
    store_page(store, new)
    # A committer journals and marks generation 2, then dies before its MULTI.
    plan = Commit(generation=2, live={new.content_sha256: "example.org"},
                  dead=[old.content_sha256], grace_s=60,
                  changes=[Change(url=old.url, record=record_of(new).model_dump_json(),
                                  new_sha=new.content_sha256,
                                  old_sha=old.content_sha256)])  # fmt: skip
    ctx.records.generations.journal(TENANT, plan)
    store.mark_pages(tenant_key=TK, generation=2, live=plan.live, dead=plan.dead)
    assert seen_hashes(ctx) == {old.content_sha256}  # generation 2 is not published
    other = make_page(url="https://s.test/q", text="other text", title="other")
    store_page(store, other)
    ctx.records.commit(TENANT, other.url, store=store, record=record_of(other), grace_s=60)
    assert ctx.records.generations.pending(TENANT) is None
    assert ctx.records.generations.published(TENANT) == 3
    assert ctx.records.get(TENANT, old.url).content_sha256 == new.content_sha256  # type: ignore[union-attr]
    assert seen_hashes(ctx) == {new.content_sha256, other.content_sha256}


def test_a_tenant_indexed_before_generations_is_marked_live_once(r: redis.Redis) -> None:
    store = MemoryVectorStore()
    ctx = ctx_for(r, store)
    page = make_page(url="https://s.test/p", text="legacy text", title="legacy")
    store_page(store, page)
    ctx.records.touch(TENANT, record_of(page))  # a record written by the previous version
    r.sadd(f"webctx:index:refs:{page.content_sha256}", f"{TENANT} {page.url}")
    assert ctx.records.generations.published(TENANT) is None
    assert seen_hashes(ctx) == {page.content_sha256}
    assert ctx.records.generations.published(TENANT) == 1


def test_two_urls_sharing_a_text_keep_it_live_until_both_leave(r: redis.Redis) -> None:
    store = MemoryVectorStore()
    ctx = ctx_for(r, store)
    shared = make_page(url="https://s.test/a", text="shared text", title="shared")
    store_page(store, shared)
    for url in ("https://s.test/a", "https://s.test/b"):
        ctx.records.commit(TENANT, url, store=store, record=record_of(shared, url), grace_s=60)
    ctx.records.drop(TENANT, "https://s.test/a", store=store, grace_s=60)
    assert seen_hashes(ctx) == {shared.content_sha256}
    ctx.records.drop(TENANT, "https://s.test/b", store=store, grace_s=60)
    assert seen_hashes(ctx) == set()


def test_concurrent_commits_are_grouped_and_every_record_lands(r: redis.Redis) -> None:
    store = MemoryVectorStore()
    ctx = ctx_for(r, store)
    pages = [make_page(url=f"https://s.test/{i}", text=f"text {i}", title=f"t{i}")
             for i in range(24)]  # fmt: skip
    for page in pages:
        store_page(store, page)
    barrier = threading.Barrier(8)

    def commit_some(part: list[Page]) -> None:
        barrier.wait()
        for page in part:
            ctx.records.commit(TENANT, page.url, store=store, record=record_of(page), grace_s=60)

    threads = [threading.Thread(target=commit_some, args=(pages[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(ctx.records.pages(TENANT)) == {p.url for p in pages}
    assert 1 <= (ctx.records.generations.published(TENANT) or 0) <= 24
    assert seen_hashes(ctx) == {p.content_sha256 for p in pages}


class CountingStore(MemoryVectorStore):
    """Records which points a search reads whole; searching with payloads is an error."""

    def __init__(self) -> None:
        super().__init__()
        self.retrieved: list[list[str]] = []
        self.sweep_first: list[str] = []  # pages deleted between ranking and reading

    def retrieve(self, ids: Sequence[str]) -> dict[str, StoredChunk]:
        self.retrieved.append(list(ids))
        self.delete_pages(self.sweep_first)
        return super().retrieve(ids)


def test_search_reads_payloads_of_the_returned_hits_only(r: redis.Redis) -> None:
    store = CountingStore()
    ctx = ctx_for(r, store)
    pages = [make_page(url=f"https://s.test/{i}", text=f"text {i}", title=f"t{i}")
             for i in range(10)]  # fmt: skip
    for page in pages:
        store_page(store, page)
        ctx.records.commit(TENANT, page.url, store=store, record=record_of(page), grace_s=60)
    hits = search_index("t3 words", tenant=TENANT, ctx=ctx, limit=4)
    assert len(hits) == 4 and len(store.retrieved) == 1 and len(store.retrieved[0]) == 4
    assert hits[0].content_sha256 == pages[3].content_sha256 and hits[0].title == "t3"
    assert hits[0].dense_rank is not None and hits[0].sparse_rank is not None
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    store.sweep_first = [pages[3].content_sha256]  # swept after ranking: left out
    hits = search_index("t3 words", tenant=TENANT, ctx=ctx, limit=4)
    assert 0 < len(hits) < 4 and pages[3].content_sha256 not in {h.content_sha256 for h in hits}
