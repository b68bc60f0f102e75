"""The persistent index: per tenant, each URL's current content hash, re-indexed on schedule.

Points are content-addressed (UUIDv5 of content hash, offsets, model) and every search
filters the store by a set of content hashes, so the index is a pointer per URL:

    webctx:index:<tenant>:pages   hash  url -> IndexedPage JSON (hash, validators, misses)
    webctx:index:refs:<sha>       set   "<tenant> <url>" entries pointing at that hash
    webctx:index:page:<sha>       str   the Page (text and metadata), while referenced
    webctx:index:graveyard        zset  sha -> when its points may be deleted

A changed page is embedded and upserted under its NEW hash first; then one MULTI switches
the URL's pointer (and its references); the old hash's points are deleted `grace_s`
later, and only if nothing points at them any more. Index search reads the pointers once
(one HGETALL) and queries with that hash set, so it sees each page whole, old or new,
never empty and never mixed. A search slower than `grace_s` could still miss a page.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, cast

import redis
from pydantic import BaseModel

from webctx.embed_cache import RedisEmbeddingCache
from webctx.errors import FetchError, HTTPStatusError
from webctx.models import Page, ScoredChunk
from webctx.ports import ConditionalFetcher, Embedder, IndexStore
from webctx.ratelimit import RedisRateLimiter
from webctx.research import index_page
from webctx.settings import ChunkSettings, EmbedSettings, IndexSettings
from webctx.sources import Source, discover_urls
from webctx.sparse import rrf
from webctx.stages.chunk import chunk_page
from webctx.stages.embed import embed_texts
from webctx.stages.fetch import extract_page
from webctx.stages.store import make_points

logger = logging.getLogger(__name__)

_PREFIX = "webctx:index"


class IndexedPage(BaseModel):
    """What the index knows of one URL of a tenant."""

    url: str
    source_id: str
    content_sha256: str
    model: str
    etag: str | None = None
    last_modified: str | None = None
    fetched_at: float
    """When the body was last confirmed current (200 with the same text, or 304)."""
    changed_at: float
    misses: int = 0
    chunks: int = 0
    title: str = ""
    site: str = ""
    published: str | None = None


class PageIndex:
    """The URL -> current content hash pointers of every tenant, in Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def _pages(self, tenant: str) -> str:
        return f"{_PREFIX}:{tenant}:pages"

    @staticmethod
    def _refs(sha: str) -> str:
        return f"{_PREFIX}:refs:{sha}"

    @staticmethod
    def _page(sha: str) -> str:
        return f"{_PREFIX}:page:{sha}"

    def get(self, tenant: str, url: str) -> IndexedPage | None:
        """The current record of one URL."""
        raw = self.r.hget(self._pages(tenant), url)
        return IndexedPage.model_validate_json(cast(str, raw)) if raw else None

    def pages(self, tenant: str) -> dict[str, IndexedPage]:
        """url -> record of every indexed page of the tenant, read at one instant."""
        raw = cast(dict[str, str], self.r.hgetall(self._pages(tenant)))
        return {url: IndexedPage.model_validate_json(v) for url, v in raw.items()}

    def stored_page(self, sha: str) -> Page | None:
        """The stored Page of a content hash, while some URL points at it."""
        raw = self.r.get(self._page(sha))
        return Page.model_validate_json(cast(str, raw)) if raw else None

    def touch(self, tenant: str, record: IndexedPage) -> None:
        """Rewrite a record whose content hash did not change (validators, times, misses)."""
        self.r.hset(self._pages(tenant), record.url, record.model_dump_json())

    def revive(self, sha: str) -> None:
        """A hash about to be pointed at again must not be swept meanwhile."""
        self.r.zrem(f"{_PREFIX}:graveyard", sha)

    def switch(
        self, tenant: str, record: IndexedPage, page: Page, *, old_sha: str | None, grace_s: float
    ) -> None:
        """Point the URL at `record.content_sha256` in one transaction (points stored first)."""
        member = f"{tenant} {record.url}"
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self._page(record.content_sha256), page.model_dump_json())
        pipe.sadd(self._refs(record.content_sha256), member)
        pipe.hset(self._pages(tenant), record.url, record.model_dump_json())
        if old_sha and old_sha != record.content_sha256:
            pipe.srem(self._refs(old_sha), member)
            pipe.zadd(f"{_PREFIX}:graveyard", {old_sha: time.time() + grace_s})
        pipe.execute()

    def drop(self, tenant: str, url: str, *, grace_s: float) -> IndexedPage | None:
        """Remove a URL from the index; its points go after the grace period."""
        record = self.get(tenant, url)
        if record is None:
            return None
        pipe = self.r.pipeline(transaction=True)
        pipe.hdel(self._pages(tenant), url)
        pipe.srem(self._refs(record.content_sha256), f"{tenant} {url}")
        pipe.zadd(f"{_PREFIX}:graveyard", {record.content_sha256: time.time() + grace_s})
        pipe.execute()
        return record

    def drop_source(self, tenant: str, source_id: str, *, grace_s: float) -> int:
        """Remove every page a source brought in; returns how many."""
        urls = [u for u, rec in self.pages(tenant).items() if rec.source_id == source_id]
        return sum(1 for url in urls if self.drop(tenant, url, grace_s=grace_s))

    def sweepable(self, *, now: float | None = None) -> list[str]:
        """Hashes past their grace period that nothing points at; taken off the graveyard."""
        now = time.time() if now is None else now
        due = cast(list[str], self.r.zrangebyscore(f"{_PREFIX}:graveyard", "-inf", now))
        taken: list[str] = []
        for sha in due:
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self._refs(sha))  # type: ignore[no-untyped-call]
                    referenced = bool(pipe.scard(self._refs(sha)))
                    pipe.multi()
                    pipe.zrem(f"{_PREFIX}:graveyard", sha)
                    if not referenced:
                        pipe.delete(self._page(sha))
                    removed = pipe.execute()[0]
                except redis.WatchError:
                    continue  # pointed at again meanwhile: keep it
            if removed and not referenced:
                taken.append(sha)  # this sweeper took it off, not a concurrent one
        return taken

    def current(
        self,
        tenant: str,
        *,
        site: str | None = None,
        source_id: str | None = None,
        published_from: str | None = None,
        published_to: str | None = None,
    ) -> dict[str, IndexedPage]:
        """content_sha256 -> record of the tenant's current pages matching the filters."""
        out: dict[str, IndexedPage] = {}
        for record in self.pages(tenant).values():
            if site and record.site.lower() != site.lower():
                continue
            if source_id and record.source_id != source_id:
                continue
            if (published_from or published_to) and not record.published:
                continue
            published = record.published or ""
            if published_from and published < published_from:
                continue
            if published_to and published[: len(published_to)] > published_to:
                continue
            out.setdefault(record.content_sha256, record)
        return out

    def fresh_page(
        self, tenant: str, url: str, *, max_age_s: float, model: str, now: float | None = None
    ) -> Page | None:
        """The indexed page of `url` if confirmed current within `max_age_s` (same model)."""
        record = self.get(tenant, url)
        now = time.time() if now is None else now
        if record is None or record.model != model or now - record.fetched_at > max_age_s:
            return None
        return self.stored_page(record.content_sha256)


def hashes_of(records: Iterable[IndexedPage]) -> list[str]:
    """The distinct content hashes of some records."""
    return sorted({r.content_sha256 for r in records})


# -- re-indexing ----------------------------------------------------------------------------
Outcome = Literal["added", "changed", "unchanged", "not_modified", "missing", "removed", "failed"]
GONE_STATUSES = frozenset({404, 410})


@dataclass
class IndexContext:
    """The collaborators of a re-index run (built once per worker process)."""

    index: PageIndex
    fetcher: ConditionalFetcher
    embedder: Embedder
    store: IndexStore
    chunking: ChunkSettings
    embedding: EmbedSettings
    settings: IndexSettings
    cache: RedisEmbeddingCache | None = None
    limiter: RedisRateLimiter | None = None
    extract_timeout_s: float = 15.0


@dataclass
class RefreshReport:
    """What one run of one source did; `fetched` counts 200 responses."""

    source_id: str
    discovered: int = 0
    fetched: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    chunks_embedded: int = 0
    embed_requests: int = 0
    swept: int = 0
    seconds: float = 0.0
    error: str | None = None

    def as_dict(self) -> dict[str, float | int | str | None]:
        """Flat counts for logs, the run record and the CLI."""
        return {"discovered": self.discovered, "fetched": self.fetched,
                **{k: self.outcomes.get(k, 0) for k in Outcome.__args__},  # type: ignore[attr-defined]
                "chunks_embedded": self.chunks_embedded, "embed_requests": self.embed_requests,
                "swept": self.swept, "seconds": round(self.seconds, 3),
                "error": self.error}  # fmt: skip


def refresh_source(source: Source, ctx: IndexContext) -> RefreshReport:
    """Re-index every page of a source: conditional GET, embed only what changed, swap."""
    started = time.monotonic()
    report = RefreshReport(source_id=source.source_id)
    try:
        found = discover_urls(source, ctx.fetcher, max_pages=ctx.settings.max_pages)
    except FetchError as exc:
        report.error = f"discovery failed: {exc}"
        report.seconds = time.monotonic() - started
        return report  # the pages stay as they are: a flaky sitemap removes nothing
    report.discovered = len(found.urls)
    with ThreadPoolExecutor(max(1, ctx.settings.concurrency)) as pool:
        results = list(pool.map(lambda url: reindex_url(source, url, ctx), found.urls))
    for outcome, fetched, chunks, requests in results:
        report.outcomes[outcome] += 1
        report.fetched += fetched
        report.chunks_embedded += chunks
        report.embed_requests += requests
    if found.complete:  # dropped from its sitemap: removed
        listed = set(found.urls)
        for url, record in ctx.index.pages(source.tenant).items():
            if record.source_id == source.source_id and url not in listed:
                if ctx.index.drop(source.tenant, url, grace_s=ctx.settings.grace_s):
                    report.outcomes["removed"] += 1
    report.swept = sweep(ctx)
    report.seconds = time.monotonic() - started
    logger.info("source re-indexed", extra={"tenant": source.tenant, **report.as_dict()})
    return report


def reindex_url(source: Source, url: str, ctx: IndexContext) -> tuple[Outcome, int, int, int]:
    """Re-index one URL: (outcome, 200 responses, chunks embedded, embed requests)."""
    tenant, index, now = source.tenant, ctx.index, time.time()
    prev = index.get(tenant, url)
    try:
        download = ctx.fetcher.fetch(
            url,
            etag=prev.etag if prev else None,
            last_modified=prev.last_modified if prev else None,
        )
    except HTTPStatusError as exc:
        if exc.status not in GONE_STATUSES or prev is None:
            return "failed", 0, 0, 0
        if prev.misses + 1 >= ctx.settings.gone_after:
            index.drop(tenant, url, grace_s=ctx.settings.grace_s)
            return "removed", 0, 0, 0
        index.touch(tenant, prev.model_copy(update={"misses": prev.misses + 1}))
        return "missing", 0, 0, 0
    except FetchError:
        return "failed", 0, 0, 0
    if download.status == 304 and prev is not None:
        index.touch(tenant, prev.model_copy(update={"fetched_at": now, "misses": 0}))
        return "not_modified", 0, 0, 0
    try:
        page = extract_page(download, timeout_s=ctx.extract_timeout_s)
    except FetchError:
        return "failed", 1, 0, 0
    if prev is not None and page.content_sha256 == prev.content_sha256:
        validators = {"etag": page.etag, "last_modified": page.last_modified}
        index.touch(tenant, prev.model_copy(update={**validators, "fetched_at": now, "misses": 0}))
        return "unchanged", 1, 0, 0
    chunks, requests = _store_page(page, ctx)
    record = IndexedPage(
        url=url, source_id=source.source_id, content_sha256=page.content_sha256,
        model=ctx.embedder.model, etag=page.etag, last_modified=page.last_modified,
        fetched_at=now, changed_at=now, chunks=chunks, title=page.title, site=page.site,
        published=page.published,
    )  # fmt: skip
    old = prev.content_sha256 if prev else None
    index.switch(tenant, record, page, old_sha=old, grace_s=ctx.settings.grace_s)
    return ("changed" if prev else "added"), 1, chunks, requests


def _store_page(page: Page, ctx: IndexContext) -> tuple[int, int]:
    """Dense and sparse points of a page under its content hash, before any pointer moves."""
    ctx.index.revive(page.content_sha256)
    outcome = index_page(page, embedder=ctx.embedder, store=ctx.store, chunking=ctx.chunking,
                         embedding=ctx.embedding, cache=ctx.cache,
                         limiter=ctx.limiter)  # fmt: skip
    chunks = chunk_page(page, max_tokens=ctx.chunking.max_tokens,
                        overlap_tokens=ctx.chunking.overlap_tokens)  # fmt: skip
    points = make_points(chunks, [[] for _ in chunks], url=page.final_url,
                         model=ctx.embedder.model)  # fmt: skip
    for start in range(0, len(points), 256):
        ctx.store.upsert_sparse(points[start : start + 256])
    return outcome.chunks, outcome.requests


def sweep(ctx: IndexContext) -> int:
    """Delete the points of hashes nothing has pointed at for the grace period."""
    taken = ctx.index.sweepable()
    if taken:
        ctx.store.delete_pages(taken)
    return len(taken)


def remove_source(source: Source, ctx: IndexContext) -> int:
    """Drop a removed source's pages from the index (points go after the grace period)."""
    return ctx.index.drop_source(source.tenant, source.source_id, grace_s=ctx.settings.grace_s)


# -- search ---------------------------------------------------------------------------------
class IndexHit(BaseModel):
    """One chunk found in the index, with its page's metadata and both ranks."""

    url: str
    title: str
    site: str
    published: str | None
    source_id: str
    content_sha256: str
    start: int
    end: int
    text: str
    score: float
    dense_rank: int | None = None
    sparse_rank: int | None = None


def search_index(
    query: str,
    *,
    tenant: str,
    ctx: IndexContext,
    limit: int = 10,
    site: str | None = None,
    source_id: str | None = None,
    published_from: str | None = None,
    published_to: str | None = None,
) -> list[IndexHit]:
    """Hybrid search of a tenant's current pages: dense + BM25, fused by RRF."""
    pages = ctx.index.current(tenant, site=site, source_id=source_id,
                              published_from=published_from,
                              published_to=published_to)  # fmt: skip
    if not pages or limit < 1:
        return []
    hashes, pool = list(pages), max(limit * 5, 50)
    e = ctx.embedding
    vector = embed_texts([query], ctx.embedder, max_inputs=1,
                         max_tokens_per_request=e.max_tokens_per_request,
                         max_input_tokens=e.max_input_tokens,
                         max_attempts=e.max_attempts).vectors[0]  # fmt: skip
    dense = ctx.store.search(vector, limit=pool, content_sha256s=hashes)
    sparse = ctx.store.search_sparse(query, limit=pool, content_sha256s=hashes)
    by_key: dict[str, ScoredChunk] = {}
    ranks: list[dict[str, int]] = [{}, {}]
    for side, hits in enumerate((dense, sparse)):
        for rank, hit in enumerate(hits, start=1):
            key = f"{hit.chunk.content_sha256}:{hit.chunk.start}:{hit.chunk.end}"
            by_key.setdefault(key, hit)
            ranks[side].setdefault(key, rank)
    fused = rrf([list(ranks[0]), list(ranks[1])])
    out = []
    for key, score in fused[:limit]:
        chunk = by_key[key].chunk
        record = pages[chunk.content_sha256]
        out.append(IndexHit(
            url=record.url, title=record.title, site=record.site, published=record.published,
            source_id=record.source_id, content_sha256=chunk.content_sha256, start=chunk.start,
            end=chunk.end, text=chunk.text, score=round(score, 6),
            dense_rank=ranks[0].get(key), sparse_rank=ranks[1].get(key),
        ))  # fmt: skip
    return out
