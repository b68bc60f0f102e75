"""How a job gets one URL's page: the index's fresh copy, the page cache, one download.

A job reuses a page any job downloaded within the cache window, or that window's failure
(interactive jobs in broker mode, and those limited to recent pages, download anew); past
the window, a page with validators is asked for with a conditional GET (304: the stored
page is reused). Downloads of one URL are single-flight: one job downloads while the others
wanting it wait for its outcome.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import redis

from webctx.errors import ExtractionError, FetchError, NeedsRender
from webctx.jobs.caches import PageCache, RememberedFailure
from webctx.jobs.engine import Engine
from webctx.jobs.rendering import TO_RENDER, ToRender, always_rendered, render_refusal
from webctx.jobs.steps import record_failure
from webctx.models import Failure, Page
from webctx.stages.fetch import extract_page

logger = logging.getLogger(__name__)
CLAIM_ATTEMPTS = 3
"""Times a batch item tries to claim a URL's download before downloading it regardless."""


def fetch_for_job(
    engine: Engine, job_id: str, url_id: str, url: str
) -> Page | ToRender | None:
    """The page of `url` for the job (saved in the job store), TO_RENDER when a browser
    must render it (`webctx.jobs.rendering`), or None with the failure recorded."""
    jobs = engine.jobs
    indexed = _indexed_copy(engine, job_id, url)
    if indexed is not None:  # no download; its embed is an idempotent upsert (cache hits)
        jobs.add_counts(job_id, index_reused=1)
        jobs.save_page(job_id, url_id, indexed)
        return indexed
    cache = engine.page_cache
    if not reads_caches(engine, job_id):  # a recency-limited question fetches anew
        return _download(engine, job_id, url_id, url, cache)
    fetch = engine.settings.fetch
    hold_s = fetch.total_timeout_s + fetch.extract_timeout_s + 5.0
    for _ in range(CLAIM_ATTEMPTS):
        reused = _cached_outcome(engine, job_id, url_id, url, cache)
        if reused is not None:
            return reused if isinstance(reused, Page) else None
        if cache.claim_download(url, hold_s=hold_s):
            try:
                return _download(engine, job_id, url_id, url, cache)
            finally:
                cache.release_download(url)
        cache.wait_download(url, timeout_s=hold_s)
    return _download(engine, job_id, url_id, url, cache)  # the claims keep failing: go alone


def reads_caches(engine: Engine, job_id: str) -> bool:
    """Whether the job takes pages and search results from the caches: batch items do,
    and so do the embedded default's interactive jobs not limited to recent pages (asking
    the same question again, from any local client, then downloads and embeds nothing).
    Interactive jobs in broker mode fetch anew, as they did before."""
    jobs = engine.jobs
    if jobs.batch_of(job_id):
        return True
    return engine.settings.embedded and jobs.request(job_id).recency_days is None


def _indexed_copy(engine: Engine, job_id: str, url: str) -> Page | None:
    """The tenant's indexed copy of `url` if re-indexed within WEBCTX_INDEX__MAX_AGE_S."""
    settings = engine.settings
    if settings.index.max_age_s <= 0 or not settings.state_url():
        return None
    tenant = engine.jobs.tenant(job_id) or settings.local_tenant
    return engine.indexed_copy(tenant, url)


def _cached_outcome(
    engine: Engine, job_id: str, url_id: str, url: str, cache: PageCache
) -> Page | Failure | None:
    """The page downloaded within the window, or the failure of its last download (each
    recorded for this job), or None."""
    jobs = engine.jobs
    page = cache.fresh_page(url, jobs.page)
    if page is not None:
        jobs.add_counts(job_id, pages_reused=1)
        jobs.save_page(job_id, url_id, page)
        return page
    failed = cache.failure(url)
    if failed is None:
        return None
    failure = Failure(url=url, stage=failed.stage, error=failed.error, reason=failed.reason)  # type: ignore[arg-type]
    jobs.add_failure(job_id, url_id, failure)
    return failure


def _download(
    engine: Engine, job_id: str, url_id: str, url: str, cache: PageCache
) -> Page | ToRender | None:
    """Download and extract `url` for the job; remember the page (or the failure). A page
    fetched before, past its window, is asked for with its validators (conditional GET).
    A script-rendered shell, or any page of an "always render" domain, goes to render."""
    jobs = engine.jobs
    stale = cache.stale(url) if reads_caches(engine, job_id) else None
    prior = jobs.page(stale.sha) if stale else None
    try:
        if stale is not None and prior is not None:
            download = engine.fetcher.fetch(url, etag=stale.etag,
                                            last_modified=stale.last_modified)  # fmt: skip
        else:
            download = engine.fetcher.fetch(url)
        if download.status == 304 and prior is not None:
            jobs.add_counts(job_id, pages_revalidated=1)
            page = prior.model_copy(update={"fetched_at": datetime.now(UTC)})
        else:
            jobs.add_counts(job_id, pages_downloaded=1)
            page = extract_page(download, timeout_s=engine.settings.fetch.extract_timeout_s)
            if always_rendered(engine, url):
                return TO_RENDER
    except (NeedsRender, ExtractionError) as exc:
        diverted = _to_render(engine, job_id, url_id, url, exc)
        if diverted is not None:
            return diverted
        cache.remember_failure(url, RememberedFailure("extract", exc.reason, str(exc)))
        return None
    except FetchError as exc:
        jobs.add_counts(job_id, pages_downloaded=1)
        stage = "extract" if exc.reason == "extraction" else "fetch"
        record_failure(engine, job_id, url_id, url, stage, exc)
        cache.remember_failure(url, RememberedFailure(stage, exc.reason, str(exc)))
        return None
    except redis.RedisError:
        raise  # the job store or the shared pacer is down, not the page: redelivered later
    except Exception as exc:  # a bug on an odd page must settle it, not stall the job
        logger.exception("fetch failed", extra={"job_id": job_id, "url": url})
        record_failure(engine, job_id, url_id, url, "fetch", exc)
        return None
    jobs.save_page(job_id, url_id, page)
    cache.remember(url, page)
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
