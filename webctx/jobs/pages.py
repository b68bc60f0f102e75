"""The steps of one page of a job: fetch (or render), embed (chunk + embed, staged), store.

Each page moves on by itself: fetched, it goes to the embed queue unless its text is
known to be stored already; embedded, its vectors wait in Redis for the store queue (the
one process that holds the vector store); stored, nothing to store, or failed, it is
settled, and the last settled page starts rank (`webctx.jobs.fanin`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import redis

from webctx.errors import ProviderDown, TransientError
from webctx.jobs.ahead import ahead_wanted, embed_page_ahead
from webctx.jobs.engine import Engine, Retry
from webctx.jobs.fetching import fetch_for_job
from webctx.jobs.rendering import ToRender, render_for_job
from webctx.jobs.steps import prefiltered, provider_down, record_failure
from webctx.models import Failure, Page
from webctx.stages.compose import EmbeddedPage, IndexOutcome, embed_page, store_page

logger = logging.getLogger(__name__)


def fetch_one(engine: Engine, job_id: str, url_id: str) -> None:
    """Download and extract one page (once), then hand it to the embed queue, or settle
    it here (a failure, or its text already stored), or send it to the render queue (its
    fetch then completes when the render ends)."""
    _get_page(engine, job_id, url_id, "fetch", fetch_for_job)


def render_one(engine: Engine, job_id: str, url_id: str) -> None:
    """Render one page in the browser (once) and extract the rendered DOM; then, as a
    fetch would, hand it to the embed queue or settle it."""
    _get_page(engine, job_id, url_id, "render", render_for_job)


GetPage = Callable[[Engine, str, str, str], Page | ToRender | None]


def _get_page(engine: Engine, job_id: str, url_id: str, stage: str, get: GetPage) -> None:
    """The page of `url_id` by `get` (unless the job has it, or its fetch step is done),
    under the stage's delivery count; then on to `_fetched`, or to the render queue."""
    jobs = engine.jobs
    if not jobs.is_active(job_id):
        return
    url = jobs.url(job_id, url_id)
    page = jobs.page_for(job_id, url_id)
    if page is None and not jobs.is_done(job_id, "fetch", url_id):
        jobs.mark_stage(job_id, stage, start=True)
        with _delivery(engine, job_id, stage, url_id, url=url) as alive:
            got = get(engine, job_id, url_id, url) if alive else None
        jobs.mark_stage(job_id, stage, start=False)
        if isinstance(got, ToRender):
            engine.fanin.to_render(job_id, url_id)
            return
        page = got
    _fetched(engine, job_id, url_id, page)


def _fetched(engine: Engine, job_id: str, url_id: str, page: Page | None) -> None:
    """The page's fetch is complete: on to embed, or settled (failed, or stored already)."""
    engine.fanin.fetched(job_id, url_id)
    if page is not None and prefiltered(engine, job_id):
        if ahead_wanted(engine, job_id):
            engine.fanin.to_embed(job_id, url_id)  # its likely chunks ahead, then settled
        else:
            engine.fanin.settled(job_id, url_id)  # rank embeds what it can reach of it
    elif page is not None and not _stored_already(engine, job_id, url_id, page):
        engine.fanin.to_embed(job_id, url_id)
    else:
        engine.fanin.settled(job_id, url_id)


def embed_one(engine: Engine, job_id: str, url_id: str, *, retry: Retry) -> None:
    """Chunk and embed one page and stage the vectors for its store task, or settle the
    page here (already stored, nothing to store, or failed). A first-pass job's page is
    embedded ahead of rank instead (its likely chunks, into the embedding cache:
    `webctx.jobs.ahead`), then settled."""
    jobs = engine.jobs
    if not jobs.is_active(job_id):
        return
    page = jobs.page_for(job_id, url_id)
    if prefiltered(engine, job_id):  # a first-pass job: nothing is staged or stored now
        if page is not None and not jobs.is_done(job_id, "embed", url_id):
            with _delivery(engine, job_id, "embed", url_id, url=page.url) as alive:
                if alive:
                    embed_page_ahead(engine, job_id, page)
        engine.fanin.settled(job_id, url_id)
        return
    staged: bool | None = False
    if page is not None and not jobs.is_done(job_id, "embed", url_id):
        jobs.mark_stage(job_id, "embed", start=True)
        with _delivery(engine, job_id, "embed", url_id, url=page.url) as alive:
            if alive:
                staged = _embed_and_stage(engine, job_id, url_id, page, retry)
        jobs.mark_stage(job_id, "embed", start=False)
    if staged is None:  # the job failed: its provider is down
        return
    if staged:
        engine.fanin.to_store(job_id, url_id)
    else:
        engine.fanin.settled(job_id, url_id)


def store_one(engine: Engine, job_id: str, url_id: str, *, retry: Retry) -> None:
    """Write one page's staged chunks to the vector store, then settle the page."""
    jobs = engine.jobs
    if not jobs.is_active(job_id):
        return
    page = jobs.page_for(job_id, url_id)
    if page is not None and not jobs.is_done(job_id, "embed", url_id):
        jobs.mark_stage(job_id, "store", start=True)
        with _delivery(engine, job_id, "store", url_id, url=page.url) as alive:
            if alive:
                _store_staged(engine, job_id, url_id, page, retry)
        jobs.mark_stage(job_id, "store", start=False)
    engine.fanin.settled(job_id, url_id)


def index_later(
    engine: Engine,
    job_id: str,
    url_ids: Sequence[str] | None = None,
    *,
    retry: Retry,
    pause: Callable[[], bool] = lambda: True,
) -> bool:
    """Chunk, embed and store every chunk of an answered one-off job's pages (`url_ids`,
    or all it got), for the index, one page at a time (its chunks that the first pass
    embedded come from the embedding cache). Before each page `pause()` waits while more
    urgent work runs, and False stops here: False is returned, the pages left undone (a
    later call skips those indexed). Runs where the vector store is open, at low
    priority; a failure is logged, the job is done."""
    for url_id in url_ids if url_ids is not None else engine.jobs.urls(job_id):
        page = engine.jobs.page_for(job_id, url_id)
        if page is None or engine.stored.chunks(page.content_sha256) is not None:
            continue
        if not pause():
            return False
        _index_page(engine, job_id, page, retry)
    return True


def _index_page(engine: Engine, job_id: str, page: Page, retry: Retry) -> None:
    try:
        embedded = _embed(engine, page)
        written = store_page(embedded, store=engine.store, url=page.final_url,
                             model=engine.embedder.model)  # fmt: skip
    except (ProviderDown, TransientError) as exc:  # down: a later job indexes the page
        if isinstance(exc, TransientError):
            retry(exc)
        logger.warning("page not indexed", extra={"job_id": job_id, "url": page.url,
                                                  "error": str(exc)})  # fmt: skip
        return
    engine.stored.mark(page.content_sha256, written)
    logger.info("page indexed after its job", extra={"job_id": job_id, "url": page.url,
                                                     "chunks": written})  # fmt: skip


def _stored_already(engine: Engine, job_id: str, url_id: str, page: Page) -> bool:
    """True when the page needs no embed task: settled already, or its text is known to be
    in the store (counted here). In a batch most pages are, and a task hop costs more CPU
    than the check (the embed task checks again, for pages stored meanwhile)."""
    if engine.jobs.is_done(job_id, "embed", url_id):
        return True
    return _counted_if_stored(engine, job_id, page)


def _counted_if_stored(engine: Engine, job_id: str, page: Page) -> bool:
    """True, with the page's chunks counted as already stored, when its text is in the
    store (another job stored it)."""
    stored = engine.stored.chunks(page.content_sha256)
    if stored is None:
        return False
    engine.jobs.add_counts(job_id, chunks=stored, chunks_already_stored=stored)
    return True


def _embed(engine: Engine, page: Page) -> EmbeddedPage:
    """Chunk and embed the page with this process's embedder, cache and rate limit."""
    return embed_page(page, embedder=engine.embedder, chunking=engine.settings.chunk,
                      embedding=engine.settings.embed, cache=engine.cache,
                      limiter=engine.limiter)  # fmt: skip


def _embed_and_stage(
    engine: Engine, job_id: str, url_id: str, page: Page, retry: Retry
) -> bool | None:
    """Chunk and embed the page and stage it; True when the store task must follow, None
    when the embeddings provider is down (the job failed)."""
    if _counted_if_stored(engine, job_id, page):  # nothing to chunk or embed
        return False
    try:
        embedded = _embed(engine, page)
        if embedded.chunks:
            engine.staging.put(embedded.chunks, embedded.vectors)
    except ProviderDown as exc:
        provider_down(engine, job_id, exc)
        return None
    except TransientError as exc:
        retry(exc)
        record_failure(engine, job_id, url_id, page.url, "embed", exc)
        return False
    except redis.RedisError:
        # The job store / embedding cache is down (Redis restarting), not the page: no
        # page failure; the unacked task is redelivered after the visibility timeout.
        raise
    except Exception as exc:  # a bug on an odd page must settle it, not stall the job
        logger.exception("embed failed", extra={"job_id": job_id, "url": page.url})
        record_failure(engine, job_id, url_id, page.url, "embed", exc)
        return False
    _count_embedding(engine, job_id, embedded.outcome)
    if not embedded.chunks:  # no text to store: the page is settled as stored
        engine.stored.mark(page.content_sha256, 0)
        return False
    # For its rank's BM25, now rather than after the last page (webctx/jobs/counts_ahead.py).
    engine.counts_ahead.count(job_id, [c.text for c in embedded.chunks],
                              lambda: engine.jobs.request(job_id).question)  # fmt: skip
    return True


def _store_staged(engine: Engine, job_id: str, url_id: str, page: Page, retry: Retry) -> None:
    """Upsert the page's staged chunks and mark the page stored. A page whose staged
    entry is gone (expired, Redis lost it) is embedded again here."""
    if _counted_if_stored(engine, job_id, page):  # another job's store task wrote it
        return
    try:
        staged = engine.staging.get(page.content_sha256)
        chunks = staged.chunks(page) if staged is not None else None
        if staged is not None and chunks and chunks[-1].end <= len(page.text):
            vectors = staged.vectors.tolist()
            embedded = EmbeddedPage(chunks, vectors, IndexOutcome(len(chunks), 0, 0))
        else:
            logger.warning("staged chunks missing; embedding again",
                           extra={"job_id": job_id, "url": page.url})  # fmt: skip
            embedded = _embed(engine, page)
            _count_embedding(engine, job_id, embedded.outcome)
        written = store_page(embedded, store=engine.store, url=page.final_url,
                             model=engine.embedder.model,
                             durable=not engine.defers_flush)  # fmt: skip
    except TransientError as exc:
        retry(exc)
        record_failure(engine, job_id, url_id, page.url, "store", exc)
        return
    except redis.RedisError:
        raise  # as in _embed_and_stage: redelivered once Redis is back
    except Exception as exc:  # a bug on an odd page must settle it, not stall the job
        logger.exception("store failed", extra={"job_id": job_id, "url": page.url})
        record_failure(engine, job_id, url_id, page.url, "store", exc)
        return

    def durable() -> None:  # the mark makes later jobs skip the page: only once durable
        engine.stored.mark(page.content_sha256, written)
        engine.staging.drop(page.content_sha256)

    # The job's rank searches the points already; only the mark waits for the flush.
    if not engine.after_durable(durable):
        durable()
    engine.jobs.add_counts(job_id, chunks=written)


def _count_embedding(engine: Engine, job_id: str, outcome: IndexOutcome) -> None:
    engine.jobs.add_counts(job_id, embed_requests=outcome.requests, tokens_embedded=outcome.tokens,
                           cache_hits=outcome.cache_hits,
                           tokens_saved=outcome.tokens_saved)  # fmt: skip


@contextmanager
def _delivery(engine: Engine, job_id: str, task: str, item: str, *, url: str) -> Iterator[bool]:
    """False, with a `worker_lost` failure recorded, once `max_deliveries` deliveries of this
    item died with their worker. Celery requeues a task whose worker died however often
    that happened, so a page that kills its worker would otherwise loop forever."""
    jobs = engine.jobs
    lost = jobs.start_delivery(job_id, task, item) - 1
    try:
        if lost >= engine.settings.max_deliveries:
            error = f"the worker died {lost} times while running {task} on this item; skipped"
            failure = Failure(url=url, stage=task, error=error, reason="worker_lost")  # type: ignore[arg-type]
            jobs.add_failure(job_id, item, failure)
            logger.warning("item skipped", extra={"job_id": job_id, "url": url, "lost": lost})
            yield False
        else:
            yield True
    finally:
        jobs.end_delivery(job_id, task, item)
