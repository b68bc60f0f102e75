"""How a job gets one URL's page: the index's copy, the page cache, one download.

What a job accepts instead of a download is its freshness contract (`max_age`,
webctx/jobs/freshness.py): an index or page-cache copy confirmed current within it is
used as is (`index`, `cached`). Past it, a copy with validators is asked for with a
conditional GET (304: `revalidated`); `max_age=0` downloads without validators (`live`).
`max_age=-1` takes a stored copy of any age and never downloads (no copy: the page fails
`not_cached`). Without a `max_age`, the jobs that read the caches (`reads_caches`: batch
items, the embedded default's interactive jobs not limited to recent pages) take the
page-cache window; the others download anew. Jobs that read the caches also reuse the
failure of a download made within the window, and their downloads of one URL are
single-flight: one job downloads while the others wanting it wait for its outcome. When a
download fails and the request allows `stale_if_error`, the newest stored copy stands in,
marked stale, instead of a failure; when none does and the download failed for a transport
reason, a search provider's copy of the page (`webctx.jobs.provider_copy`).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import redis

from webctx.errors import BlockedURL, ExtractionError, FetchError, NeedsRender, UnreadablePdf
from webctx.jobs.caches import RememberedFailure
from webctx.jobs.engine import Engine
from webctx.jobs.freshness import Freshness, freshness_for, retrieval
from webctx.jobs.provider_copy import provider_copy
from webctx.jobs.rendering import TO_RENDER, ToRender, always_rendered, render_refusal
from webctx.jobs.reservations import download_opt_outs, marked, refused_copy
from webctx.jobs.steps import record_failure
from webctx.models import Failure, JobRequest, Page, Retrieval
from webctx.settings import Settings
from webctx.stages.fetch import extract_page

logger = logging.getLogger(__name__)
CLAIM_ATTEMPTS = 3
"""Times a batch item tries to claim a URL's download before downloading it regardless."""


def job_freshness(engine: Engine, job_id: str) -> Freshness:
    """The job's freshness contract: its request under the configured windows."""
    return _freshness(engine, job_id)[0]


def _freshness(engine: Engine, job_id: str) -> tuple[Freshness, bool]:
    """The job's freshness contract, and whether it reads the caches (`reads_caches`),
    each of the job's facts read once: a fetch task's every round trip to the job store
    waits its turn among twenty tasks' at a job's start."""
    settings, jobs = engine.settings, engine.jobs
    request, batch = jobs.request(job_id), jobs.batch_of(job_id)
    reads = reads_caches(settings, request, batch)
    index_s = settings.index.max_age_s if settings.state_url() else 0.0
    fresh = freshness_for(request, created_at=jobs.created_at(job_id),
                          cache_ttl_s=engine.page_cache.ttl_s, index_max_age_s=index_s,
                          cache_by_default=reads)  # fmt: skip
    return fresh, reads


def fetch_for_job(engine: Engine, job_id: str, url_id: str, url: str) -> Page | ToRender | None:
    """The page of `url` for the job (saved in the job store), TO_RENDER when a browser
    must render it (`webctx.jobs.rendering`), or None with the failure recorded."""
    jobs, cache = engine.jobs, engine.page_cache
    fresh, reads = _freshness(engine, job_id)
    indexed = _indexed_copy(engine, job_id, url, fresh, fresh.index_max_age_s)
    if indexed is not None:  # no download; its embed is an idempotent upsert (cache hits)
        page, checked_at = indexed
        jobs.add_counts(job_id, index_reused=1)
        jobs.save_page(job_id, url_id, page, retrieval("index", checked_at))
        return page
    if not reads:  # no waiting on others' downloads
        wants_copy = fresh.cache_max_age_s > 0  # only when the request names a max_age
        cached = _cached_page(engine, job_id, url_id, url, fresh) if wants_copy else None
        return cached or _download(engine, job_id, url_id, url, fresh)
    fetch = engine.settings.fetch
    hold_s = fetch.total_timeout_s + max(fetch.extract_timeout_s, fetch.pdf_timeout_s) + 5.0
    for _ in range(CLAIM_ATTEMPTS):
        reused = _cached_outcome(engine, job_id, url_id, url, fresh)
        if reused is not None:
            return reused if isinstance(reused, Page) else None
        if cache.claim_download(url, hold_s=hold_s):
            try:
                return _download(engine, job_id, url_id, url, fresh)
            finally:
                cache.release_download(url)
        cache.wait_download(url, timeout_s=hold_s)
    return _download(engine, job_id, url_id, url, fresh)  # the claims keep failing: go alone


def reads_caches(settings: Settings, request: JobRequest, batch: str | None) -> bool:
    """Whether the job takes pages and search results from the caches: batch items do,
    and so do the embedded default's interactive jobs not limited to recent pages (asking
    the same question again, from any local client, then downloads and embeds nothing).
    Interactive jobs in broker mode fetch anew, as they did before, unless their request
    names a `max_age`."""
    return bool(batch) or (settings.embedded and request.recency_days is None)


def _indexed_copy(
    engine: Engine, job_id: str, url: str, fresh: Freshness, max_age_s: float
) -> tuple[Page, float] | None:
    """The tenant's indexed copy of `url` and when it was confirmed current, if the job
    accepts it (confirmed within `max_age_s`, or since the job began)."""
    settings = engine.settings
    if settings.index.max_age_s <= 0 or not settings.state_url():
        return None
    tenant = engine.jobs.tenant(job_id) or settings.local_tenant
    window = max(max_age_s, time.time() - fresh.not_before)
    found = engine.indexed_copy(tenant, url, window)
    return None if found is None or refused_copy(settings.fetch, found[0]) else found


def _cached_page(
    engine: Engine, job_id: str, url_id: str, url: str, fresh: Freshness
) -> Page | None:
    """The page-cache copy of `url` if the job accepts its age (recorded for the job)."""
    entry = engine.page_cache.entry(url)
    if entry is None or not fresh.accepts(
        entry.fetched_at, window_s=fresh.cache_max_age_s, now=time.time()
    ):
        return None
    page = engine.jobs.page(entry.sha)
    if page is None or refused_copy(engine.settings.fetch, page):  # refused: download anew
        return None
    engine.jobs.add_counts(job_id, pages_reused=1)
    engine.jobs.save_page(job_id, url_id, page, retrieval("cached", entry.fetched_at))
    return page


def _cached_outcome(
    engine: Engine, job_id: str, url_id: str, url: str, fresh: Freshness
) -> Page | Failure | None:
    """The page downloaded within the window, or the failure of its last download (each
    recorded for this job), or None."""
    page = _cached_page(engine, job_id, url_id, url, fresh)
    if page is not None:
        return page
    failed = engine.page_cache.failure(url)
    now = time.time()
    if failed is None or not fresh.accepts(
        failed.failed_at, window_s=fresh.cache_max_age_s, now=now
    ):
        return None
    if fresh.stale_if_error:
        stale = _stale_copy(engine, job_id, url_id, url, failed.reason)
        if stale is not None:
            return stale
    failure = Failure(url=url, stage=failed.stage, error=failed.error, reason=failed.reason)  # type: ignore[arg-type]
    engine.jobs.add_failure(job_id, url_id, failure)
    return failure


def _download(
    engine: Engine, job_id: str, url_id: str, url: str, fresh: Freshness
) -> Page | ToRender | None:
    """Download and extract `url` for the job; remember the page (or the failure). A copy
    past the job's window is asked for with its validators (conditional GET), unless the
    job wants every page live (`max_age=0`). A script-rendered shell, or any page of an
    "always render" domain, goes to render."""
    jobs, cache = engine.jobs, engine.page_cache
    if fresh.cache_only:  # max_age=-1: no stored copy, no page
        failure = Failure(url=url, stage="fetch", reason="not_cached",
                          error="no stored copy, and the request allows no download")  # fmt: skip
        jobs.add_failure(job_id, url_id, failure)
        return None
    entry = cache.entry(url) if fresh.cache_max_age_s > 0 else None
    prior = jobs.page(entry.sha) if entry is not None and entry.revalidatable else None
    try:
        if entry is not None and prior is not None:
            download = engine.fetcher.fetch(url, etag=entry.etag,
                                            last_modified=entry.last_modified)  # fmt: skip
        else:
            download = engine.fetcher.fetch(url)
        opted = download_opt_outs(engine.settings.fetch, download, prior)  # raises OptedOut
        if download.status == 304 and prior is not None:
            jobs.add_counts(job_id, pages_revalidated=1)
            page = prior.model_copy(update={"fetched_at": datetime.now(UTC)})
            how = retrieval("revalidated", page.fetched_at)
        else:
            jobs.add_counts(job_id, pages_downloaded=1)
            page = extract_page(download, timeout_s=engine.settings.fetch.extract_timeout_s,
                                pdf=engine.pdf, html=engine.html)  # fmt: skip
            how = retrieval("live", page.fetched_at)
            if always_rendered(engine, url) and page.page_starts is None:  # a PDF is no shell
                return TO_RENDER
    except UnreadablePdf as exc:  # a browser would not read the PDF any better
        record_failure(engine, job_id, url_id, url, "extract", exc)
        cache.remember_failure(url, RememberedFailure("extract", exc.reason, str(exc)))
        return None
    except (NeedsRender, ExtractionError) as exc:
        diverted = _to_render(engine, job_id, url_id, url, exc)
        if diverted is not None:
            return diverted
        cache.remember_failure(url, RememberedFailure("extract", exc.reason, str(exc)))
        return None
    except FetchError as exc:
        jobs.add_counts(job_id, pages_downloaded=1)
        stage = "extract" if exc.reason == "extraction" else "fetch"
        cache.remember_failure(url, RememberedFailure(stage, exc.reason, str(exc)))
        # A refusal of the guard (address, robots.txt, an opt-out) is a decision, not an
        # outage.
        if fresh.stale_if_error and not isinstance(exc, BlockedURL):
            stale = _stale_copy(engine, job_id, url_id, url, exc.reason)
            if stale is not None:
                return stale
        # A search provider's copy, for a transport failure only (never a refusal).
        copy = provider_copy(engine, job_id, url_id, url, exc)
        if copy is not None:
            return copy
        record_failure(engine, job_id, url_id, url, stage, exc)
        return None
    except redis.RedisError:
        raise  # the job store or the shared pacer is down, not the page: redelivered later
    except Exception as exc:  # a bug on an odd page must settle it, not stall the job
        logger.exception("fetch failed", extra={"job_id": job_id, "url": url})
        record_failure(engine, job_id, url_id, url, "fetch", exc)
        return None
    page = marked(page, opted)
    jobs.save_page(job_id, url_id, page, how)
    cache.remember(url, page)
    return page


def _stale_copy(engine: Engine, job_id: str, url_id: str, url: str, reason: str) -> Page | None:
    """The newest stored copy of `url` of any age (page cache, else the index), recorded
    for the job as stale, or None."""
    jobs = engine.jobs
    entry = engine.page_cache.entry(url)
    page = jobs.page(entry.sha) if entry is not None else None
    how: Retrieval | None = None
    if entry is not None and page is not None:
        how = retrieval("cached", entry.fetched_at, stale_reason=reason)
    else:
        indexed = _indexed_copy(engine, job_id, url, job_freshness(engine, job_id), float("inf"))
        if indexed is not None:
            page, checked_at = indexed
            how = retrieval("index", checked_at, stale_reason=reason)
    if page is None or how is None:
        return None
    jobs.add_counts(job_id, pages_stale=1)
    jobs.save_page(job_id, url_id, page, how)
    logger.info("stale copy served", extra={"job_id": job_id, "url": url, "reason": reason})
    return page


def _to_render(
    engine: Engine, job_id: str, url_id: str, url: str, exc: NeedsRender | ExtractionError
) -> ToRender | None:
    """TO_RENDER for a shell (or an empty page of an "always render" domain) that may be
    rendered; else None with the failure recorded (`needs_render` says why not)."""
    if not isinstance(exc, NeedsRender) and not always_rendered(engine, url):
        record_failure(engine, job_id, url_id, url, "extract", exc)
        return None
    why = render_refusal(engine, url)
    if why is None:
        return TO_RENDER
    record_failure(engine, job_id, url_id, url, "extract", NeedsRender(url, f"{exc}; {why}"))
    return None
