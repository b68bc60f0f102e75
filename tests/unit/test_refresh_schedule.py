"""A run by hand and the schedule's runs do not ask the same pages twice in a row."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import redis_url
from tests.unit.test_index import TENANT, CountingEmbedder, FakeSite, add_sitemap_source, article
from webctx.adapters.memory_store import MemoryVectorStore
from webctx.index import refresh
from webctx.index.page_records import PageRecords
from webctx.index.refresh import IndexContext, refresh_source
from webctx.index.sources import SourceRegistry
from webctx.jobs.caches import StoredPages
from webctx.settings import ChunkSettings, EmbedSettings, IndexSettings

PATHS = ["/a.html", "/b.html", "/c.html"]


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def site() -> FakeSite:
    site = FakeSite()
    for path in PATHS:
        site.put(path, article(path.strip("/.html")))
    return site


@pytest.fixture
def ctx(r: redis.Redis, site: FakeSite) -> IndexContext:
    return IndexContext(
        records=PageRecords(r), stored_pages=StoredPages(r, ttl_s=3600, scope=["test store"]),
        fetcher=site, embedder=CountingEmbedder(), store=MemoryVectorStore(),
        chunking=ChunkSettings(max_tokens=64, overlap_tokens=8), embedding=EmbedSettings(),
        settings=IndexSettings(grace_s=0.0, gone_after=2, concurrency=4),
    )  # fmt: skip


def page_requests(site: FakeSite) -> int:
    return sum(1 for url, _ in site.requests if url.endswith(".html"))


def test_the_schedule_does_not_run_again_right_after_a_run_by_hand(
    r: redis.Redis, site: FakeSite, ctx: IndexContext
) -> None:
    # `sources add` makes a source due at once; a `sources refresh` right after it indexes
    # every page, and the next tick must not find the source still due and ask them again.
    registry = SourceRegistry(r)
    source = add_sitemap_source(r, site, PATHS)
    started = time.time()
    report = refresh_source(source, ctx, confirmed_since=started)
    registry.record_run(source, report.as_dict(), started_at=started)
    assert registry.claim_due(now=time.time()) == []
    assert registry.due_at(TENANT, source.source_id) == pytest.approx(started + source.every_s)
    assert registry.claim_due(now=started + source.every_s + 1) != []


def test_a_run_never_moves_the_schedule_earlier(r: redis.Redis, site: FakeSite) -> None:
    registry = SourceRegistry(r)
    source = add_sitemap_source(r, site, PATHS)
    now = time.time()
    assert [s.source_id for s in registry.claim_due(now=now)] == [source.source_id]
    later = registry.due_at(TENANT, source.source_id)  # the claim moved it to now + every_s
    registry.record_run(source, {}, started_at=now - 600)  # an older run finishing late
    assert registry.due_at(TENANT, source.source_id) == later


def test_a_removed_source_is_not_scheduled_again_by_its_last_run(
    r: redis.Redis, site: FakeSite
) -> None:
    registry = SourceRegistry(r)
    source = add_sitemap_source(r, site, PATHS)
    registry.remove(TENANT, source.source_id)
    registry.record_run(source, {}, started_at=time.time())
    assert registry.due_at(TENANT, source.source_id) is None


def test_a_run_waiting_behind_another_skips_the_pages_that_run_confirmed(
    r: redis.Redis, site: FakeSite, ctx: IndexContext
) -> None:
    # Beat's first run of a source just added holds it when the caller asks for a run:
    # the caller's run then finds every page confirmed after its request.
    source = add_sitemap_source(r, site, PATHS)
    requested = time.time()
    refresh_source(source, ctx)  # the other run, which finished after the request
    asked = page_requests(site)
    waited = refresh_source(source, ctx, confirmed_since=requested)
    assert waited.outcomes["current"] == 3 and waited.fetched == 0
    assert page_requests(site) == asked  # no page asked again
    assert waited.outcomes["removed"] == 0  # still listed, still indexed


def test_a_run_asked_for_after_the_last_confirmation_asks_every_page(
    r: redis.Redis, site: FakeSite, ctx: IndexContext
) -> None:
    source = add_sitemap_source(r, site, PATHS)
    refresh_source(source, ctx)
    asked = page_requests(site)
    site.put("/b.html", article("beta", version=2))
    again = refresh_source(source, ctx, confirmed_since=time.time())
    assert again.outcomes["not_modified"] == 2 and again.outcomes["changed"] == 1
    assert page_requests(site) == asked + 3


class GraphStore(MemoryVectorStore):
    """An Optimizable store (as the embedded engine is): points wait for a graph until
    `optimize`, which records how many pages the run had committed by then."""

    def __init__(self, records: PageRecords) -> None:
        super().__init__()
        self.indexed, self.records, self.optimized_at = 0, records, []  # type: ignore[var-annotated]

    def unindexed(self) -> int:
        return self.count() - self.indexed

    def optimize(self) -> bool:
        self.indexed = self.count()
        self.optimized_at.append(len(self.records.urls(TENANT)))
        return True


def test_a_long_run_builds_graphs_while_it_writes_not_only_at_its_end(
    r: redis.Redis, site: FakeSite, ctx: IndexContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = [f"/p{i}.html" for i in range(12)]
    for path in paths:
        site.put(path, article(f"topic{path}"))
    monkeypatch.setattr(refresh, "OPTIMIZE_AFTER", 10)
    monkeypatch.setattr(refresh, "CHECK_EVERY", 1)
    store = GraphStore(ctx.records)
    ctx = dataclasses.replace(ctx, store=store, settings=IndexSettings(concurrency=1))
    report = refresh_source(add_sitemap_source(r, site, paths), ctx)
    assert report.outcomes["added"] == 12
    assert store.optimized_at and store.optimized_at[0] < 12  # before the last page
    assert store.unindexed() < 10 + report.chunks_embedded // 12
