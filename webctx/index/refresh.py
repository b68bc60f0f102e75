"""The persistent index: per tenant, each URL's current content hash, re-indexed on schedule.

Page records (`webctx.index.page_records`) map each URL of a tenant to a content hash; points are
content-addressed (UUIDv5 of content hash, offsets, model) and carry per-tenant live
marks (`webctx.index.generations`). A changed page is embedded and upserted under its NEW hash
first, unmarked; then one commit marks it live (and the old hash not) for the next
generation and publishes that generation with the record switch in one MULTI. A search
reads the published generation once and filters the store by it: each page whole, old or
new, never empty and never mixed, without listing the tenant's pages. The old hash's
points are deleted `grace_s` later, and only if nothing points at them any more.

A run reads its pages' records in one HMGET per 500 URLs and writes back the records of
unchanged pages (304s: new fetch time) in one compare-and-set script per 500.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Literal

from webctx.errors import FetchError, HTTPStatusError, OptedOut
from webctx.index.page_records import PageRecord, PageRecords, Seen
from webctx.index.sources import Source, discover_urls
from webctx.jobs.caches import StoredPages
from webctx.jobs.reservations import download_opt_outs, marked
from webctx.models import Download, Page
from webctx.net.ratelimit import RedisRateLimiter
from webctx.protocols import (
    BatchFetcher,
    ConditionalFetcher,
    Embedder,
    EmbeddingCache,
    IndexStore,
    Optimizable,
    PdfReader,
    Revalidation,
)
from webctx.settings import ChunkSettings, EmbedSettings, FetchSettings, IndexSettings
from webctx.stages.chunk import chunk_page
from webctx.stages.compose import index_page
from webctx.stages.fetch import extract_page
from webctx.stages.store import make_points

logger = logging.getLogger(__name__)


def hashes_of(records: Iterable[PageRecord]) -> list[str]:
    """The distinct content hashes of some records."""
    return sorted({r.content_sha256 for r in records})


# -- re-indexing ----------------------------------------------------------------------------
Outcome = Literal[
    "added",
    "changed",
    "unchanged",
    "not_modified",
    "missing",
    "removed",
    "failed",
    "opted_out",
    "current",
]
"""`current`: confirmed by another run since this one was asked for, so not asked again."""
GONE_STATUSES = frozenset({404, 410})


@dataclass
class IndexContext:
    """The collaborators of a re-index run (built once per worker process)."""

    records: PageRecords
    stored_pages: StoredPages
    """The marks of pages known to be stored: a sweep voids those of the pages it deletes."""
    fetcher: ConditionalFetcher
    embedder: Embedder
    store: IndexStore
    chunking: ChunkSettings
    embedding: EmbedSettings
    settings: IndexSettings
    cache: EmbeddingCache | None = None
    limiter: RedisRateLimiter | None = None
    extract_timeout_s: float = 15.0
    pdf: PdfReader | None = None
    """Reads PDFs (in a sandbox); None: a PDF fails as unsupported."""
    fetch: FetchSettings = field(default_factory=FetchSettings)
    """The product token and opt-out mode pages are judged by (`kept_out`)."""


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
    skipped: list[str] = field(default_factory=list)
    """Sitemap index entries the network guard refused ("<url>: <reason>")."""

    def as_dict(self) -> dict[str, float | int | str | None]:
        """Flat counts for logs, the run record and the CLI."""
        return {"discovered": self.discovered, "fetched": self.fetched,
                **{k: self.outcomes.get(k, 0) for k in Outcome.__args__},  # type: ignore[attr-defined]
                "chunks_embedded": self.chunks_embedded, "embed_requests": self.embed_requests,
                "swept": self.swept, "seconds": round(self.seconds, 3),
                "error": self.error, "skipped": len(self.skipped),
                "skipped_entries": "; ".join(self.skipped[:5]) or None}  # fmt: skip


@dataclass
class UrlResult:
    """What re-indexing one URL did; `touch` is a record to write back (CAS, batched)."""

    outcome: Outcome
    fetched: int = 0
    chunks: int = 0
    requests: int = 0
    touch: tuple[str, PageRecord] | None = None


def refresh_source(
    source: Source, ctx: IndexContext, *, confirmed_since: float | None = None
) -> RefreshReport:
    """Re-index every page of a source: conditional GET, embed only what changed, swap.

    A page confirmed current at or after `confirmed_since` (the time this run was asked
    for; a run of the same source that held it meanwhile did the work) is left as it is."""
    started = time.monotonic()
    report = RefreshReport(source_id=source.source_id)
    try:
        found = discover_urls(source, ctx.fetcher, max_pages=ctx.settings.max_pages)
    except FetchError as exc:
        report.error = f"discovery failed: {exc}"
        report.seconds = time.monotonic() - started
        return report  # the pages stay as they are: a flaky sitemap removes nothing
    report.discovered = len(found.urls)
    report.skipped = found.skipped
    if found.skipped:
        logger.warning("sitemap entries skipped", extra={"tenant": source.tenant,
                       "source_id": source.source_id, "skipped": found.skipped[:20]})  # fmt: skip
    results = _reindex_urls(source, found.urls, ctx, confirmed_since=confirmed_since)
    ctx.records.touch_many(source.tenant, [r.touch for r in results if r.touch])
    for result in results:
        report.outcomes[result.outcome] += 1
        report.fetched += result.fetched
        report.chunks_embedded += result.chunks
        report.embed_requests += result.requests
    if found.complete:  # dropped from its sitemap: removed
        report.outcomes["removed"] += _drop_unlisted(source, set(found.urls), ctx)
    report.swept = sweep(ctx)
    report.seconds = time.monotonic() - started
    logger.info("source re-indexed", extra={"tenant": source.tenant, **report.as_dict()})
    return report


def _reindex_urls(
    source: Source, urls: list[str], ctx: IndexContext, *, confirmed_since: float | None
) -> list[UrlResult]:
    """Revalidate every URL not confirmed since `confirmed_since`; settle 304s and errors
    here, index changed pages in a pool."""
    seen = ctx.records.seen(source.tenant, urls)
    results: list[UrlResult] = []
    if confirmed_since is not None:
        fresh = {
            url
            for url, (_, rec) in seen.items()
            if rec.fetched_at >= confirmed_since and rec.source_id == source.source_id
        }
        results = [UrlResult("current") for _ in fresh]
        urls = [u for u in urls if u not in fresh]
    requests = [_revalidation(url, seen.get(url)) for url in urls]
    workers = max(1, ctx.settings.concurrency)
    with ThreadPoolExecutor(workers) as pool:
        busy = threading.BoundedSemaphore(2 * workers)  # bodies waiting in the pool, at most
        changed: list[Future[UrlResult]] = []
        for i, fetched in _revalidate(ctx.fetcher, requests, window=workers, pool=pool):
            url = urls[i]
            settled = settle_url(source, url, fetched, seen.get(url), ctx)
            if isinstance(settled, UrlResult):
                results.append(settled)
                continue
            busy.acquire()
            task = pool.submit(index_download, source, url, settled, seen.get(url), ctx)
            task.add_done_callback(lambda _: busy.release())
            changed.append(task)
        results += [task.result() for task in changed]
    return results


def _revalidation(url: str, seen: Seen | None) -> Revalidation:
    prev = seen[1] if seen else None
    return Revalidation(url, prev.etag if prev else None, prev.last_modified if prev else None)


def _revalidate(
    fetcher: ConditionalFetcher,
    requests: list[Revalidation],
    *,
    window: int,
    pool: ThreadPoolExecutor,
) -> Iterator[tuple[int, Download | FetchError]]:
    """The fetcher's own batch when it has one, else one pool thread per request."""
    if isinstance(fetcher, BatchFetcher):
        yield from fetcher.fetch_many(requests, window=window)
        return

    def one(i: int) -> tuple[int, Download | FetchError]:
        req = requests[i]
        try:
            return i, fetcher.fetch(req.url, etag=req.etag, last_modified=req.last_modified)
        except FetchError as exc:
            return i, exc

    futures = [pool.submit(one, i) for i in range(len(requests))]
    for future in as_completed(futures):
        yield future.result()


def _drop_unlisted(source: Source, listed: set[str], ctx: IndexContext) -> int:
    """Remove the source's pages its (complete) sitemap no longer lists."""
    unlisted = [u for u in ctx.records.urls(source.tenant) if u not in listed]
    dropped = 0
    for url, (_, record) in ctx.records.seen(source.tenant, unlisted).items():
        if record.source_id == source.source_id and ctx.records.drop(
            source.tenant, url, store=ctx.store, grace_s=ctx.settings.grace_s
        ):
            dropped += 1
    return dropped


def settle_url(
    source: Source, url: str, fetched: Download | FetchError, seen: Seen | None, ctx: IndexContext
) -> UrlResult | Download:
    """The outcome of a 304 or a failure (a record to touch, a removal), or the Download
    of a 200 to index."""
    raw, prev = seen if seen else ("", None)
    if isinstance(fetched, HTTPStatusError):
        if fetched.status not in GONE_STATUSES or prev is None:
            return UrlResult("failed")
        if prev.misses + 1 >= ctx.settings.gone_after:
            ctx.records.drop(source.tenant, url, store=ctx.store, grace_s=ctx.settings.grace_s)
            return UrlResult("removed")
        missed = prev.model_copy(update={"misses": prev.misses + 1})
        return UrlResult("missing", touch=(raw, missed))
    if isinstance(fetched, FetchError):
        return UrlResult("failed")
    if kept_out(fetched, ctx) is not None:
        if prev is not None:
            ctx.records.drop(source.tenant, url, store=ctx.store, grace_s=ctx.settings.grace_s)
        return UrlResult("opted_out", fetched=int(fetched.status != 304))
    if fetched.status == 304 and prev is not None:
        touched = prev.model_copy(update={"fetched_at": time.time(), "misses": 0})
        return UrlResult("not_modified", touch=(raw, touched))
    return fetched


def kept_out(download: Download, ctx: IndexContext) -> str | None:
    """The rule keeping a page out of the index: `noindex` (or `none`), always; a
    reservation (`noai`, TDM) unless opt-outs are only reported, then the page is indexed
    with its mark. A 304 is judged by its headers and its origin's tdmrep.json."""
    try:
        found = download_opt_outs(ctx.fetch, download, None)
    except OptedOut as exc:
        return exc.rule
    return found.noindex


def index_download(
    source: Source, url: str, download: Download, seen: Seen | None, ctx: IndexContext
) -> UrlResult:
    """Extract a 200; embed, store and switch to it if its text changed."""
    raw, prev = seen if seen else ("", None)
    now = time.time()
    try:
        page = extract_page(download, timeout_s=ctx.extract_timeout_s, pdf=ctx.pdf)
    except FetchError:
        return UrlResult("failed", fetched=1)
    page = marked(page, download_opt_outs(ctx.fetch, download, None))
    if prev is not None and page.content_sha256 == prev.content_sha256:
        validators = {"etag": page.etag, "last_modified": page.last_modified}
        touched = prev.model_copy(update={**validators, "fetched_at": now, "misses": 0})
        return UrlResult("unchanged", fetched=1, touch=(raw, touched))
    chunks, requests = _store_page(page, ctx)
    record = PageRecord(
        url=url, source_id=source.source_id, content_sha256=page.content_sha256,
        model=ctx.embedder.model, etag=page.etag, last_modified=page.last_modified,
        fetched_at=now, changed_at=now, chunks=chunks, title=page.title, site=page.site,
        published=page.published,
    )  # fmt: skip
    old = ctx.records.commit(source.tenant, url, store=ctx.store, record=record, page=page,
                           grace_s=ctx.settings.grace_s)  # fmt: skip
    _optimize_while_writing(ctx.store, chunks)
    return UrlResult("changed" if old else "added", fetched=1, chunks=chunks, requests=requests)


def _store_page(page: Page, ctx: IndexContext) -> tuple[int, int]:
    """Dense and sparse points of a page under its content hash, before any record moves."""
    ctx.records.revive(page.content_sha256)
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


OPTIMIZE_AFTER = 20_000
"""Dense points searched by brute force (not yet in an HNSW graph) that make a run end
with `optimize()`: the embedded engine never builds its graphs on its own."""


def optimize_if_due(store: object, *, after: int = OPTIMIZE_AFTER) -> bool:
    """Build the store's HNSW graphs once `after` points wait for one (an Optimizable store,
    qdrant-edge; it blocks the process meanwhile: seconds per 10,000 points, see
    docs/index.md). Other stores build theirs on their own."""
    if not isinstance(store, Optimizable) or store.unindexed() < after:
        return False
    started = time.monotonic()
    built = store.optimize()
    logger.info("vector store optimized", extra={"seconds": round(time.monotonic() - started, 1)})
    return built


CHECK_EVERY = 1000
"""Chunks written between two looks at the store's unindexed points while a run writes."""
_written = [0]
_optimizing = threading.Lock()


def _optimize_while_writing(store: object, chunks: int) -> None:
    """Build graphs during a long run, once `OPTIMIZE_AFTER` points wait for one, so the
    store is searchable by graph minutes after the run's last write instead of after one
    optimize of everything at its end. Looked at every `CHECK_EVERY` chunks; one thread
    optimizes while the others go on (the engine holds the GIL meanwhile)."""
    if not isinstance(store, Optimizable) or not _optimizing.acquire(blocking=False):
        return
    try:
        _written[0] += chunks
        if _written[0] >= CHECK_EVERY:
            _written[0] = 0
            optimize_if_due(store, after=OPTIMIZE_AFTER)
    finally:
        _optimizing.release()


def sweep(ctx: IndexContext) -> int:
    """Delete the points of hashes nothing has pointed at for the grace period."""
    taken = ctx.records.sweepable()
    if taken:
        ctx.store.delete_pages(taken)
        # Research jobs skip pages known to be stored: not these any more.
        ctx.stored_pages.forget(taken)
    return len(taken)


def remove_source(source: Source, ctx: IndexContext) -> int:
    """Drop a removed source's pages from the index (points go after the grace period)."""
    return ctx.records.drop_source(source.tenant, source.source_id, store=ctx.store,
                                 grace_s=ctx.settings.grace_s)  # fmt: skip
