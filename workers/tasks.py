"""Celery tasks: thin wrappers that load by id, call a stage, save, and hand on ids."""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NoReturn

import redis
from celery import Task

from webctx.errors import FetchError, RateLimited, TransientError, WebctxError
from webctx.jobs.caches import IndexedPages, PageCache, RememberedFailure
from webctx.jobs.staging import ChunkStaging
from webctx.models import BundleStats, Failure, JobStatus, Page, SearchResult
from webctx.stages.bundle import build_bundle
from webctx.stages.compose import (
    EmbeddedPage,
    IndexOutcome,
    answer_question,
    embed_page,
    store_page,
)
from webctx.stages.embed import embed_with_cache
from webctx.stages.fetch import extract_page
from webctx.stages.plan import LLMPlanner, plan_queries
from webctx.stages.search import search_query
from webctx.workers import pipeline
from webctx.workers.app import app, worker_deps
from webctx.workers.deps import Deps

logger = logging.getLogger(__name__)
MAX_RETRIES = 5


def _retry(task: Task[Any, Any], exc: TransientError) -> NoReturn:
    """Retry later, after the provider's retry-after when it gave one (plus jitter)."""
    base = exc.retry_after if isinstance(exc, RateLimited) and exc.retry_after else 2.0
    countdown = min(base * (2**task.request.retries if base == 2.0 else 1), 60.0)
    raise task.retry(exc=exc, countdown=countdown + random.uniform(0, 0.5 * countdown))


def _can_retry(task: Task[Any, Any]) -> bool:
    return bool(task.request.retries < MAX_RETRIES)


@app.task(name="webctx.plan", acks_late=True)
def plan(job_id: str) -> str:
    """Turn the question into search queries and fan out one search per query."""
    deps = worker_deps()
    jobs = deps.jobs
    if not jobs.is_active(job_id):
        return job_id
    jobs.set_status(job_id, JobStatus.RUNNING)
    jobs.mark_stage(job_id, "plan", start=True)
    queries = jobs.queries(job_id)
    if not queries:
        request = jobs.request(job_id)
        queries = _plan(deps, request.question, request.max_queries)
        jobs.set_queries(job_id, queries)
    jobs.mark_stage(job_id, "plan", start=False)
    logger.info("job planned", extra={"job_id": job_id, "queries": len(queries)})
    if deps.cache is not None:  # rank finds the vector there instead of waiting for it
        pipeline.start_question_embedding(job_id)
    pipeline.start_searches(job_id, len(queries))
    return job_id


def _plan(deps: Deps, question: str, max_queries: int) -> list[str]:
    if deps.planner_model:
        from openai import OpenAI

        settings = deps.settings
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "none"
        client = OpenAI(base_url=settings.openai_base_url, api_key=key, max_retries=1)
        return LLMPlanner(client, deps.planner_model).plan(question, max_queries)
    return plan_queries(question, max_queries=max_queries)


@app.task(name="webctx.search", bind=True, acks_late=True)
def search(self: Task[Any, Any], job_id: str, query_idx: int) -> str:
    """Run one query; the search that completes the set starts the fetches."""
    deps = worker_deps()
    jobs = deps.jobs
    if not jobs.is_active(job_id):
        return job_id
    queries = jobs.queries(job_id)
    if not jobs.is_done(job_id, "search", str(query_idx)):
        jobs.mark_stage(job_id, "search", start=True)
        query = queries[query_idx]
        # Each query alone should be able to fill the job's sources.
        limit = max(deps.settings.search_results_per_query, jobs.request(job_id).max_sources)
        try:
            results = _cached_search(deps, job_id, query, limit)
        except TransientError as exc:
            if _can_retry(self):
                _retry(self, exc)
            results = []
            _fail(deps, job_id, f"q:{query_idx}", f"query:{query}", "search", exc)
        except WebctxError as exc:
            results = []
            _fail(deps, job_id, f"q:{query_idx}", f"query:{query}", "search", exc)
        jobs.save_search(job_id, query_idx, results)
        jobs.mark_stage(job_id, "search", start=False)
    if jobs.complete(job_id, "search", str(query_idx), total=len(queries)):
        pipeline.start_fetches(jobs, job_id)
    return job_id


@app.task(name="webctx.fetch", acks_late=True)
def fetch(job_id: str, url_id: str) -> str:
    """Download and extract one page; hand it to the embed queue, or record the failure."""
    deps = worker_deps()
    jobs = deps.jobs
    if not jobs.is_active(job_id):
        return url_id
    url = jobs.url(job_id, url_id)
    page = jobs.page_for(job_id, url_id)
    if page is None and not jobs.is_done(job_id, "fetch", url_id):
        jobs.mark_stage(job_id, "fetch", start=True)
        with _delivery(deps, job_id, "fetch", url_id, url=url) as alive:
            page = _fetch_page(deps, job_id, url_id, url) if alive else None
        jobs.mark_stage(job_id, "fetch", start=False)
    jobs.complete(job_id, "fetch", url_id, total=len(jobs.urls(job_id)))
    if page is not None and not _stored_already(deps, job_id, url_id, page):
        pipeline.start_embed(job_id, url_id)
    else:
        _settle(deps, job_id, url_id)
    return url_id


def _stored_already(deps: Deps, job_id: str, url_id: str, page: Page) -> bool:
    """True when the page needs no embed task: settled already, or its text is known to be
    in the store (counted here). In a batch most pages are, and a task hop costs more CPU
    than the check (the embed task checks again, for pages stored meanwhile)."""
    if deps.jobs.is_done(job_id, "embed", url_id):
        return True
    return _counted_if_stored(deps, job_id, deps.indexed_pages(), page)


def _counted_if_stored(deps: Deps, job_id: str, indexed: IndexedPages, page: Page) -> bool:
    """True, with the page's chunks counted as already stored, when its text is in the
    store (another job stored it)."""
    stored = indexed.chunks(page.content_sha256)
    if stored is None:
        return False
    deps.jobs.add_counts(job_id, chunks=stored, chunks_already_stored=stored)
    return True


def _embed(deps: Deps, page: Page) -> EmbeddedPage:
    """Chunk and embed the page with this worker's embedder, cache and rate limit."""
    return embed_page(
        page,
        embedder=deps.embedder,
        chunking=deps.settings.chunk,
        embedding=deps.settings.embed,
        cache=deps.cache,
        limiter=deps.limiter,
    )


@app.task(name="webctx.embed", bind=True, acks_late=True)
def embed(self: Task[Any, Any], job_id: str, url_id: str) -> str:
    """Chunk and embed one page and stage the vectors for the store task, or settle the
    page here (already stored, nothing to store, or failed)."""
    deps = worker_deps()
    jobs = deps.jobs
    if not jobs.is_active(job_id):
        return url_id
    page = jobs.page_for(job_id, url_id)
    staged = False
    if page is not None and not jobs.is_done(job_id, "embed", url_id):
        jobs.mark_stage(job_id, "embed", start=True)
        with _delivery(deps, job_id, "embed", url_id, url=page.url) as alive:
            if alive:
                staged = _embed_page(self, deps, job_id, url_id, page)
        jobs.mark_stage(job_id, "embed", start=False)
    if staged:
        pipeline.start_store(job_id, url_id)
    else:
        _settle(deps, job_id, url_id)
    return url_id


@app.task(name="webctx.store", bind=True, acks_late=True)
def store(self: Task[Any, Any], job_id: str, url_id: str) -> str:
    """Write one page's staged chunks to the vector store; the last settled page starts
    ranking. Runs where the vector store is open (`-Q store`)."""
    deps = worker_deps()
    jobs = deps.jobs
    if not jobs.is_active(job_id):
        return url_id
    page = jobs.page_for(job_id, url_id)
    if page is not None and not jobs.is_done(job_id, "embed", url_id):
        jobs.mark_stage(job_id, "store", start=True)
        with _delivery(deps, job_id, "store", url_id, url=page.url) as alive:
            if alive:
                _store_page(self, deps, job_id, url_id, page)
        jobs.mark_stage(job_id, "store", start=False)
    _settle(deps, job_id, url_id)
    return url_id


@app.task(name="webctx.embed_question", acks_late=True)
def embed_question(job_id: str) -> str:
    """Embed the job's question into the embedding cache ahead of ranking, so the rank
    task (on the one process that holds the vector store) finds it instead of waiting on
    the provider. Best effort: on any failure the rank task embeds it itself."""
    deps = worker_deps()
    jobs = deps.jobs
    if deps.cache is None or not jobs.is_active(job_id) or jobs.bundle(job_id) is not None:
        return job_id
    try:
        outcome = embed_with_cache(
            [jobs.request(job_id).question],
            deps.embedder,
            cache=deps.cache,
            limiter=deps.limiter,
            max_inputs=1,
            max_tokens_per_request=deps.settings.embed.max_tokens_per_request,
            max_input_tokens=deps.settings.embed.max_input_tokens,
            max_attempts=1,
        )
    except Exception as exc:  # noqa: BLE001 - the rank task embeds it and reports failures
        logger.info("question not embedded ahead", extra={"job_id": job_id, "error": str(exc)})
        return job_id
    jobs.add_counts(
        job_id,
        embed_requests=outcome.requests,
        tokens_embedded=outcome.tokens,
        cache_hits=outcome.cache_hits,
        tokens_saved=outcome.tokens_saved,
        question_ahead=1,  # counted here: rank reads the vector without counting it again
    )
    return job_id


def _question_ahead(deps: Deps, job_id: str, question: str) -> list[float] | None:
    """The question's vector if `embed_question` embedded (and counted) it for this job."""
    if deps.cache is None or not deps.jobs.counters(job_id).get("question_ahead"):
        return None
    dimensions = getattr(deps.embedder, "dimensions", None)
    return deps.cache.get_many(deps.embedder.model, dimensions, [question])[0]


@app.task(name="webctx.rank", bind=True, acks_late=True)
def rank(self: Task[Any, Any], job_id: str, force: bool = False) -> str:
    """Rank the job's chunks into a cited bundle; `force` is the deadline watchdog."""
    deps = worker_deps()
    jobs = deps.jobs
    if not jobs.is_active(job_id) or jobs.bundle(job_id) is not None:
        return job_id
    if force:
        logger.warning("job deadline reached", extra={"job_id": job_id})
    jobs.mark_stage(job_id, "rank", start=True)
    request = jobs.request(job_id)
    pages = jobs.pages(job_id)
    failures = jobs.failures(job_id)
    stats = _stats(deps, job_id, pages_count=len(pages))
    queries = jobs.queries(job_id)
    if not pages:
        _finish_failed(deps, job_id, request.question, queries, failures, stats, force=force)
        return job_id
    try:
        bundle = answer_question(
            job_id=job_id,
            question=request.question,
            queries=queries,
            pages=pages,
            failures=failures,
            stats=stats,
            embedder=deps.embedder,
            store=deps.store,
            top_k=request.top_k,
            token_budget=request.token_budget,
            embedding=deps.settings.embed,
            cache=deps.cache,
            limiter=deps.limiter,
            question_vector=_question_ahead(deps, job_id, request.question),
        )
    except TransientError as exc:
        if _can_retry(self):
            _retry(self, exc)
        jobs.set_status(job_id, JobStatus.FAILED, error=f"rank: {exc}")
        return job_id
    except redis.RedisError:
        raise  # the job store is down, not the job: redelivered once Redis is back
    except Exception as exc:  # noqa: BLE001 - a job must end, not wait for its watchdog
        logger.exception("rank failed", extra={"job_id": job_id})
        jobs.set_status(job_id, JobStatus.FAILED, error=f"rank: {exc or type(exc).__name__}")
        return job_id
    jobs.mark_stage(job_id, "rank", start=False)
    bundle.stats.stage_s = jobs.stage_seconds(job_id)
    bundle.stats.elapsed_s = round(time.time() - jobs.created_at(job_id), 3)
    if jobs.save_bundle(job_id, bundle):
        jobs.set_status(job_id, JobStatus.SUCCEEDED)
        logger.info("job succeeded", extra={"job_id": job_id, "chunks": len(bundle.chunks)})
    return job_id


def _cached_search(deps: Deps, job_id: str, query: str, limit: int) -> list[SearchResult]:
    """One query's results; batch items take them from the search cache when fresh."""
    recency = deps.jobs.request(job_id).recency_days
    cache = deps.search_cache
    # The cache holds unrestricted results only: a recency-limited query always goes out.
    cached = deps.jobs.batch_of(job_id) and recency is None
    results = cache.get(query, limit=limit) if cached else None
    if results is not None:
        deps.jobs.add_counts(job_id, searches_cached=1)
        return results
    results = search_query(deps.search, query, limit=limit, recency_days=recency)
    if recency is None:
        cache.put(query, results, limit=limit)
    deps.jobs.add_counts(job_id, searches_sent=1)
    return results


def _indexed_page(deps: Deps, job_id: str, url: str) -> Page | None:
    """The tenant's indexed copy of `url` if re-indexed within WEBCTX_INDEX__MAX_AGE_S."""
    if deps.settings.index.max_age_s <= 0 or not deps.settings.state_url():
        return None
    tenant = deps.jobs.tenant(job_id) or deps.settings.local_tenant
    return deps.stores.records.fresh_page(
        tenant, url, max_age_s=deps.settings.index.max_age_s, model=deps.embedder.model
    )


def _fetch_page(deps: Deps, job_id: str, url_id: str, url: str) -> Page | None:
    indexed = _indexed_page(deps, job_id, url)
    if indexed is not None:  # no download; its embed is an idempotent upsert (cache hits)
        deps.jobs.add_counts(job_id, index_reused=1)
        deps.jobs.save_page(job_id, url_id, indexed)
        return indexed
    cache = deps.page_cache
    if not deps.jobs.batch_of(job_id):  # interactive jobs fetch anew
        return _download(deps, job_id, url_id, url, cache)
    # Batch items reuse a page downloaded within the window, and download it single-flight:
    # one item downloads while the others wanting the URL wait for its outcome.
    fetch = deps.settings.fetch
    hold_s = fetch.total_timeout_s + fetch.extract_timeout_s + 5.0
    for _ in range(3):
        reused = _cached_outcome(deps, job_id, url_id, url, cache)
        if reused is not None:
            return reused if isinstance(reused, Page) else None
        if cache.claim_download(url, hold_s=hold_s):
            try:
                return _download(deps, job_id, url_id, url, cache)
            finally:
                cache.release_download(url)
        cache.wait_download(url, timeout_s=hold_s)
    return _download(deps, job_id, url_id, url, cache)  # the claims keep failing: go alone


def _cached_outcome(
    deps: Deps, job_id: str, url_id: str, url: str, cache: PageCache
) -> Page | Failure | None:
    """The page downloaded within the window, or the failure of its last download (each
    recorded for this job), or None."""
    page = cache.fresh_page(url, deps.jobs.page)
    if page is not None:
        deps.jobs.add_counts(job_id, pages_reused=1)
        deps.jobs.save_page(job_id, url_id, page)
        return page
    failed = cache.failure(url)
    if failed is None:
        return None
    failure = Failure(url=url, stage=failed.stage, error=failed.error, reason=failed.reason)  # type: ignore[arg-type]
    deps.jobs.add_failure(job_id, url_id, failure)
    return failure


def _download(deps: Deps, job_id: str, url_id: str, url: str, cache: PageCache) -> Page | None:
    """Download and extract `url` for the job; remember the page (or the failure). A page
    fetched before, past its window, is asked for with its validators (conditional GET)."""
    stale = cache.stale(url) if deps.jobs.batch_of(job_id) else None
    prior = deps.jobs.page(stale.sha) if stale else None
    try:
        timeout_s = deps.settings.fetch.extract_timeout_s
        if stale is not None and prior is not None:
            download = deps.fetcher.fetch(url, etag=stale.etag, last_modified=stale.last_modified)
        else:
            download = deps.fetcher.fetch(url)
        if download.status == 304 and prior is not None:
            deps.jobs.add_counts(job_id, pages_revalidated=1)
            page = prior.model_copy(update={"fetched_at": datetime.now(UTC)})
        else:
            deps.jobs.add_counts(job_id, pages_downloaded=1)
            page = extract_page(download, timeout_s=timeout_s)
    except FetchError as exc:
        deps.jobs.add_counts(job_id, pages_downloaded=1)
        stage = "extract" if exc.reason == "extraction" else "fetch"
        _fail(deps, job_id, url_id, url, stage, exc)
        cache.remember_failure(url, RememberedFailure(stage, exc.reason, str(exc)))
        return None
    except redis.RedisError:
        raise  # the job store or the shared pacer is down, not the page: redelivered later
    except Exception as exc:  # a bug on an odd page must settle it, not stall the job
        logger.exception("fetch failed", extra={"job_id": job_id, "url": url})
        _fail(deps, job_id, url_id, url, "fetch", exc)
        return None
    deps.jobs.save_page(job_id, url_id, page)
    cache.remember(url, page)
    return page


def _staging(deps: Deps) -> ChunkStaging:
    """Embedded pages waiting for the store task, in this index scope."""
    scope = hashlib.sha256("\x1f".join(deps.index_scope()).encode()).hexdigest()[:16]
    return ChunkStaging(deps.blobs, scope=scope)


def _embed_page(task: Task[Any, Any], deps: Deps, job_id: str, url_id: str, page: Page) -> bool:
    """Chunk and embed the page and stage it; True when the store task must follow."""
    indexed = deps.indexed_pages()
    if _counted_if_stored(deps, job_id, indexed, page):  # nothing to chunk or embed
        return False
    try:
        embedded = _embed(deps, page)
        if embedded.chunks:
            _staging(deps).put(embedded.chunks, embedded.vectors)
    except TransientError as exc:
        if _can_retry(task):
            _retry(task, exc)
        _fail(deps, job_id, url_id, page.url, "embed", exc)
        return False
    except redis.RedisError:
        # The job store / embedding cache is down (Redis restarting), not the page: no
        # page failure; the unacked task is redelivered after the visibility timeout.
        raise
    except Exception as exc:  # a bug on an odd page must settle it, not stall the job
        logger.exception("embed failed", extra={"job_id": job_id, "url": page.url})
        _fail(deps, job_id, url_id, page.url, "embed", exc)
        return False
    _count_embedding(deps, job_id, embedded.outcome)
    if not embedded.chunks:  # no text to store: the page is settled as stored
        indexed.mark(page.content_sha256, 0)
        return False
    return True


def _store_page(task: Task[Any, Any], deps: Deps, job_id: str, url_id: str, page: Page) -> None:
    """Upsert the page's staged chunks and mark the page stored. A page whose staged
    entry is gone (expired, Redis lost it) is embedded again here."""
    indexed = deps.indexed_pages()
    if _counted_if_stored(deps, job_id, indexed, page):  # another job's store task wrote it
        return
    staging = _staging(deps)
    try:
        staged = staging.get(page.content_sha256)
        chunks = staged.chunks(page) if staged is not None else None
        if staged is not None and chunks and chunks[-1].end <= len(page.text):
            vectors = staged.vectors.tolist()
            embedded = EmbeddedPage(chunks, vectors, IndexOutcome(len(chunks), 0, 0))
        else:
            logger.warning("staged chunks missing; embedding again",
                           extra={"job_id": job_id, "url": page.url})  # fmt: skip
            embedded = _embed(deps, page)
            _count_embedding(deps, job_id, embedded.outcome)
        written = store_page(embedded, store=deps.store, url=page.final_url,
                             model=deps.embedder.model)  # fmt: skip
    except TransientError as exc:
        if _can_retry(task):
            _retry(task, exc)
        _fail(deps, job_id, url_id, page.url, "store", exc)
        return
    except redis.RedisError:
        raise  # as in _embed_page: redelivered once Redis is back
    except Exception as exc:  # a bug on an odd page must settle it, not stall the job
        logger.exception("store failed", extra={"job_id": job_id, "url": page.url})
        _fail(deps, job_id, url_id, page.url, "store", exc)
        return
    indexed.mark(page.content_sha256, written)
    staging.drop(page.content_sha256)
    deps.jobs.add_counts(job_id, chunks=written)


def _count_embedding(deps: Deps, job_id: str, outcome: IndexOutcome) -> None:
    deps.jobs.add_counts(
        job_id,
        embed_requests=outcome.requests,
        tokens_embedded=outcome.tokens,
        cache_hits=outcome.cache_hits,
        tokens_saved=outcome.tokens_saved,
    )


@contextmanager
def _delivery(deps: Deps, job_id: str, task: str, item: str, *, url: str) -> Iterator[bool]:
    """False, with a `worker_lost` failure recorded, once `max_deliveries` deliveries of this
    item died with their worker: Celery's requeue of those is unconditional (TRAPS 1)."""
    jobs = deps.jobs
    lost = jobs.start_delivery(job_id, task, item) - 1
    try:
        if lost >= deps.settings.max_deliveries:
            error = f"the worker died {lost} times while running {task} on this item; skipped"
            failure = Failure(url=url, stage=task, error=error, reason="worker_lost")  # type: ignore[arg-type]
            jobs.add_failure(job_id, item, failure)
            logger.warning("item skipped", extra={"job_id": job_id, "url": url, "lost": lost})
            yield False
        else:
            yield True
    finally:
        jobs.end_delivery(job_id, task, item)


def _settle(deps: Deps, job_id: str, url_id: str) -> None:
    jobs = deps.jobs
    if jobs.complete(job_id, "embed", url_id, total=len(jobs.urls(job_id))):
        pipeline.start_rank(jobs, job_id)


def _fail(deps: Deps, job_id: str, key: str, url: str, stage: str, exc: Exception) -> None:
    reason = getattr(exc, "reason", type(exc).__name__)
    failure = Failure(url=url, stage=stage, error=str(exc) or type(exc).__name__, reason=reason)  # type: ignore[arg-type]
    deps.jobs.add_failure(job_id, key, failure)
    logger.info("source failed", extra={"job_id": job_id, "url": url, "stage": stage})


def _stats(deps: Deps, job_id: str, *, pages_count: int) -> BundleStats:
    counters = deps.jobs.counters(job_id)
    failures = deps.jobs.failures(job_id)
    return BundleStats(
        queries=len(deps.jobs.queries(job_id)),
        results=counters.get("results", 0),
        fetched=pages_count,
        failed=len(failures),
        chunks=counters.get("chunks", 0),
        embed_requests=counters.get("embed_requests", 0),
        tokens_embedded=counters.get("tokens_embedded", 0),
        cache_hits=counters.get("cache_hits", 0),
        tokens_saved=counters.get("tokens_saved", 0),
        index_reused=counters.get("index_reused", 0),
    )


def _finish_failed(
    deps: Deps,
    job_id: str,
    question: str,
    queries: list[str],
    failures: list[Failure],
    stats: BundleStats,
    *,
    force: bool,
) -> None:
    jobs = deps.jobs
    bundle = build_bundle(
        job_id=job_id,
        question=question,
        queries=queries,
        pages={},
        ranked=[],
        failures=failures,
        stats=stats,
    )
    jobs.save_bundle(job_id, bundle)
    if force and not failures:
        error = "deadline reached before any source was fetched"
    else:
        error = f"all {len(failures)} sources failed: " + "; ".join(
            f"{f.url} ({f.stage}: {f.error})" for f in failures[:5]
        )
    jobs.set_status(job_id, JobStatus.FAILED, error=error)
