"""The index: conditional re-fetch, embed only what changed, atomic swap, removal, hybrid search.

A fake conditional fetcher serves a small site (pages, a sitemap); the real PageRecords runs on
the test Redis db; the store is the in-memory adapter (the contract tests cover the others).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import redis_url
from tests.factories import make_page
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.adapters.memory_store import MemoryVectorStore
from webctx.errors import HTTPStatusError
from webctx.index.page_records import PageRecords
from webctx.index.refresh import IndexContext, refresh_source, sweep
from webctx.index.search import search_index
from webctx.index.sources import Source, SourceRegistry
from webctx.jobs.caches import StoredPages
from webctx.models import Chunk, Download, StoredChunk
from webctx.protocols import Embeddings
from webctx.settings import ChunkSettings, EmbedSettings, IndexSettings
from webctx.stages.store import make_points
from webctx.workers.index_tasks import index_context

TENANT = "acme"
BASE = "https://site.test"


def article(topic: str, version: int = 1) -> str:
    body = " ".join(
        f"<p>{topic} paragraph {i} of version {version}: the {topic} facts are described "
        f"here at length so the extractor keeps this as main text.</p>"
        for i in range(4)
    )
    return f"<html><head><title>{topic}</title></head><body><article>{body}</article></body></html>"


@dataclass
class Served:
    body: str
    status: int = 200
    content_type: str = "text/html"


class FakeSite:
    """A conditional fetcher over a dict of pages: ETag = version counter, 304 on a match."""

    def __init__(self) -> None:
        self.pages: dict[str, Served] = {}
        self.versions: dict[str, int] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()

    def put(self, path: str, body: str, *, content_type: str = "text/html") -> None:
        with self.lock:
            self.pages[BASE + path] = Served(body, content_type=content_type)
            self.versions[BASE + path] = self.versions.get(BASE + path, 0) + 1

    def delete(self, path: str) -> None:
        with self.lock:
            self.pages.pop(BASE + path, None)

    def fetch(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        media_types: frozenset[str] | None = None,
    ) -> Download:
        with self.lock:
            self.requests.append((url, etag))
            served = self.pages.get(url)
            tag = f'"v{self.versions.get(url, 0)}"'
        if served is None:
            raise HTTPStatusError(url, "HTTP 404", status=404)
        if etag == tag:
            return Download(url=url, final_url=url, status=304, content_type="", body=b"")
        return Download(url=url, final_url=url, status=200, content_type=served.content_type,
                        body=served.body.encode(), etag=tag)  # fmt: skip


class CountingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__(model="hash-embedding")
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> Embeddings:
        self.texts += len(texts)
        return super().embed(texts)


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def site() -> FakeSite:
    return FakeSite()


@pytest.fixture
def ctx(r: redis.Redis, site: FakeSite) -> IndexContext:
    return IndexContext(
        records=PageRecords(r),
        stored_pages=StoredPages(r, ttl_s=3600, scope=["test store"]),
        fetcher=site,
        embedder=CountingEmbedder(),
        store=MemoryVectorStore(),
        chunking=ChunkSettings(max_tokens=64, overlap_tokens=8),
        embedding=EmbedSettings(),
        settings=IndexSettings(grace_s=0.0, gone_after=2, concurrency=4),
    )


def sitemap(paths: list[str]) -> str:
    urls = "".join(f"<url><loc>{BASE}{p}</loc></url>" for p in paths)
    return f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'


def add_sitemap_source(r: redis.Redis, site: FakeSite, paths: list[str]) -> Source:
    site.put("/sitemap.xml", sitemap(paths), content_type="application/xml")
    return SourceRegistry(r).add(TENANT, BASE + "/sitemap.xml", every_s=3600)


def test_second_run_revalidates_and_embeds_nothing_when_nothing_changed(
    r: redis.Redis, site: FakeSite, ctx: IndexContext
) -> None:
    for name in ("a", "b", "c"):
        site.put(f"/{name}.html", article(name))
    source = add_sitemap_source(r, site, ["/a.html", "/b.html", "/c.html"])
    first = refresh_source(source, ctx)
    assert first.outcomes["added"] == 3 and first.fetched == 3
    embedded = ctx.embedder.texts  # type: ignore[attr-defined]
    second = refresh_source(source, ctx)
    assert second.outcomes["not_modified"] == 3 and second.fetched == 0
    assert ctx.embedder.texts == embedded  # type: ignore[attr-defined]
    assert all(etag for url, etag in site.requests[-3:] if url.endswith(".html"))


def test_changed_page_is_replaced_and_its_old_chunks_deleted(
    r: redis.Redis, site: FakeSite, ctx: IndexContext
) -> None:
    site.put("/a.html", article("alpha"))
    site.put("/b.html", article("beta"))
    source = add_sitemap_source(r, site, ["/a.html", "/b.html"])
    refresh_source(source, ctx)
    old = ctx.records.get(TENANT, BASE + "/a.html")
    assert old is not None
    site.put("/a.html", article("gamma", version=2))
    report = refresh_source(source, ctx)
    assert report.outcomes["changed"] == 1 and report.outcomes["not_modified"] == 1
    new = ctx.records.get(TENANT, BASE + "/a.html")
    assert new is not None and new.content_sha256 != old.content_sha256
    hits = search_index("gamma facts", tenant=TENANT, ctx=ctx, limit=50)
    assert {h.content_sha256 for h in hits if h.url.endswith("/a.html")} == {new.content_sha256}
    store = ctx.store
    assert not store.search([1.0] * 256, limit=100, content_sha256s=[old.content_sha256])


def test_unchanged_text_behind_a_new_etag_costs_no_embedding(
    r: redis.Redis, site: FakeSite, ctx: IndexContext
) -> None:
    site.put("/a.html", article("alpha"))
    source = SourceRegistry(r).add(TENANT, BASE + "/a.html", every_s=600)
    refresh_source(source, ctx)
    before = ctx.embedder.texts  # type: ignore[attr-defined]
    site.put("/a.html", article("alpha"))  # same body, new ETag
    report = refresh_source(source, ctx)
    assert report.outcomes["unchanged"] == 1 and report.fetched == 1
    assert ctx.embedder.texts == before  # type: ignore[attr-defined]


def test_page_gone_on_consecutive_runs_or_dropped_from_sitemap_is_removed(
    r: redis.Redis, site: FakeSite, ctx: IndexContext
) -> None:
    for name in ("a", "b", "c"):
        site.put(f"/{name}.html", article(name))
    source = add_sitemap_source(r, site, ["/a.html", "/b.html", "/c.html"])
    refresh_source(source, ctx)
    site.delete("/a.html")
    site.put("/sitemap.xml", sitemap(["/a.html", "/b.html"]), content_type="application/xml")
    report = refresh_source(source, ctx)
    assert report.outcomes["missing"] == 1  # one 404 is not enough
    assert report.outcomes["removed"] == 1  # c left the sitemap
    assert set(ctx.records.pages(TENANT)) == {BASE + "/a.html", BASE + "/b.html"}
    report = refresh_source(source, ctx)
    assert report.outcomes["removed"] == 1
    assert set(ctx.records.pages(TENANT)) == {BASE + "/b.html"}
    hits = search_index("a paragraph", tenant=TENANT, ctx=ctx, limit=50)
    assert {h.url for h in hits} == {BASE + "/b.html"}


def test_hybrid_search_filters_by_site_source_date_and_tenant(
    r: redis.Redis, site: FakeSite, ctx: IndexContext
) -> None:
    site.put("/a.html", article("zebra"))
    site.put("/b.html", article("quokka"))
    source = add_sitemap_source(r, site, ["/a.html", "/b.html"])
    refresh_source(source, ctx)
    hits = search_index("quokka", tenant=TENANT, ctx=ctx, limit=3)
    assert hits and hits[0].url == BASE + "/b.html"
    assert hits[0].sparse_rank == 1
    assert search_index("quokka", tenant="other", ctx=ctx) == []
    assert search_index("quokka", tenant=TENANT, ctx=ctx, site="elsewhere.test") == []
    assert search_index("quokka", tenant=TENANT, ctx=ctx, source_id="nope") == []
    assert search_index("quokka", tenant=TENANT, ctx=ctx, published_from="2000-01-01") == []


def test_search_never_sees_a_page_empty_or_mixed_during_swaps(
    r: redis.Redis, site: FakeSite, ctx: IndexContext
) -> None:
    ctx.settings.grace_s = 5.0
    site.put("/a.html", article("swap"))
    source = SourceRegistry(r).add(TENANT, BASE + "/a.html", every_s=600)
    refresh_source(source, ctx)
    bad: list[str] = []
    stop = threading.Event()

    def searcher() -> None:
        while not stop.is_set():
            hashes = {h.content_sha256 for h in search_index("swap facts", tenant=TENANT,
                                                             ctx=ctx, limit=50)}  # fmt: skip
            if len(hashes) != 1:
                bad.append(f"{len(hashes)} versions")

    thread = threading.Thread(target=searcher)
    thread.start()
    for version in range(2, 8):
        site.put("/a.html", article("swap", version=version))
        refresh_source(source, ctx)
    stop.set()
    thread.join()
    assert not bad


def test_registry_claims_each_due_run_once_across_racing_ticks(r: redis.Redis) -> None:
    registry = SourceRegistry(r)
    registry.add(TENANT, BASE + "/a.html", every_s=600)
    claims: list[int] = []
    barrier = threading.Barrier(4)

    def tick() -> None:
        barrier.wait()
        claims.append(len(registry.claim_due()))

    threads = [threading.Thread(target=tick) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claims) == [0, 0, 0, 1]
    assert registry.claim_due() == []  # next due in 60 s


# -- the IndexStore methods, on every adapter ------------------------------------------------


def _points(url: str, texts: list[str]) -> list[StoredChunk]:
    text = " ".join(texts)
    page = make_page(url=url, text=text)
    chunks, pos = [], 0
    for i, t in enumerate(texts):
        start = text.index(t, pos)
        chunks.append(Chunk(content_sha256=page.content_sha256, index=i, start=start,
                            end=start + len(t), text=t, tokens=len(t.split())))  # fmt: skip
        pos = start + len(t)
    vectors = HashEmbedder().vectors(texts)
    return make_points(chunks, vectors, url=url, model="hash-embedding")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.contextmanager
def index_mcp_server(r: redis.Redis, site: FakeSite, tmp_path: Path, html: str) -> Iterator[Any]:
    """The MCP server over the tenant's index, with `html` indexed at /a.html."""
    from webctx.api.mcp import build_mcp
    from webctx.api.runtime import Runtime
    from webctx.settings import Settings
    from webctx.workers.app import set_deps
    from webctx.workers.deps import Deps, build_engine, stores_on

    settings = Settings(redis_url=redis_url(), embedding_provider="hash",
                        qdrant_path=tmp_path / "q", local_tenant=TENANT)  # fmt: skip
    store = MemoryVectorStore()
    stores = stores_on(r, settings)
    built = build_engine(settings, stores, state=r, start=lambda stage, arguments: None)
    engine = dataclasses.replace(built, fetcher=site, embedder=HashEmbedder(), _store=store)
    deps = Deps(settings=settings, stores=stores, engine=engine)
    site.put("/a.html", html)
    source = stores.sources.add(TENANT, BASE + "/a.html", every_s=600)
    set_deps(deps)
    try:
        refresh_source(source, index_context(deps))
        yield build_mcp(lambda: Runtime(settings, stores))
    finally:
        set_deps(None)


@pytest.mark.anyio
async def test_mcp_search_index_tool_answers_from_the_tenant_index(
    r: redis.Redis, site: FakeSite, tmp_path: Path
) -> None:
    from mcp import Client

    with index_mcp_server(r, site, tmp_path, article("narwhal")) as server:
        async with Client(server) as client:
            result = await client.call_tool("search_index", {"query": "narwhal", "limit": 3})
    assert not result.is_error
    hits = result.structured_content["hits"]  # type: ignore[index]
    assert hits and hits[0]["url"] == BASE + "/a.html"
    assert "narwhal" in result.content[0].text  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_mcp_search_index_site_takes_a_domain_or_the_display_name(
    r: redis.Redis, site: FakeSite, tmp_path: Path
) -> None:
    from mcp import Client

    named = article("narwhal").replace(
        "<head>", '<head><meta property="og:site_name" content="Narwhal Weekly">'
    )
    found: dict[str, int] = {}
    with index_mcp_server(r, site, tmp_path, named) as server:
        async with Client(server) as client:
            for value in ("site.test", "SITE.test", "Narwhal Weekly", "other.test", "site"):
                result = await client.call_tool("search_index", {"query": "narwhal", "site": value})
                assert not result.is_error, result.content
                found[value] = len(result.structured_content["hits"])  # type: ignore[index]
            tools = {t.name: t for t in (await client.list_tools()).tools}
    assert found["site.test"] and found["SITE.test"] and found["Narwhal Weekly"]
    assert found["other.test"] == found["site"] == 0
    assert "domain" in (tools["search_index"].input_schema["properties"]["site"]["description"])
    assert "domain" in (tools["search_index"].description or "")


@pytest.mark.anyio
@pytest.mark.parametrize("field", ["published_from", "published_to"])
async def test_mcp_search_index_refuses_a_malformed_date(
    r: redis.Redis, site: FakeSite, tmp_path: Path, field: str
) -> None:
    from mcp import Client

    with index_mcp_server(r, site, tmp_path, article("narwhal")) as server:
        async with Client(server) as client:
            result = await client.call_tool("search_index", {"query": "q", field: "2024-13-45"})
            good = await client.call_tool("search_index", {"query": "q", field: "2000-01-01"})
    assert result.is_error and field in result.content[0].text  # type: ignore[union-attr]
    assert not good.is_error


def test_sweeping_a_replaced_page_forgets_that_research_jobs_stored_it(
    r: redis.Redis, site: FakeSite, ctx: IndexContext
) -> None:
    site.put("/a.html", article("sweep"))
    source = SourceRegistry(r).add(TENANT, BASE + "/a.html", every_s=600)
    refresh_source(source, ctx)
    (old,) = {h.content_sha256 for h in search_index("sweep facts", tenant=TENANT, ctx=ctx)}
    known = StoredPages(r, ttl_s=3600, scope=("store", "model", "64/0"))
    known.mark(old, 3)
    site.put("/a.html", article("sweep", version=2))
    refresh_source(source, ctx)
    sweep(ctx)
    assert known.chunks(old) is None
