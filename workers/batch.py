"""The batch feeder: the Celery side of webctx/jobs/batches.py.

`webctx.batch_feed` runs `BatchStore.feed` for one batch. It is sent when an item's job
ends (`FeedOnItemEnd`, one of the job observers the worker's app and the API attach) and,
while the batch runs, at least every `WEBCTX_BATCH__TICK_S` (one tick scheduled per window,
claimed in Redis), so a lost message delays a batch by one tick at most. Items are
submitted as ordinary jobs with the batch priority, which their tasks inherit: workers
serve interactive jobs first.
"""

from __future__ import annotations

import logging

from webctx.jobs.batch_items import BatchItem
from webctx.jobs.batches import BatchStore, FeedLimits
from webctx.models import JobRequest
from webctx.settings import Settings
from webctx.workers.app import app, broker_priority, worker_deps
from webctx.workers.pipeline import submit_job

logger = logging.getLogger(__name__)


def feed_limits(settings: Settings) -> FeedLimits:
    """The feeder's limits from settings; the embedded worker keeps threads for others."""
    concurrency = settings.batch.concurrency
    if settings.embedded:
        concurrency = max(1, min(concurrency, settings.worker_concurrency // 2))
    return FeedLimits(
        concurrency=concurrency,
        max_inflight=settings.batch.max_inflight,
        beside_interactive=settings.batch.beside_interactive,
        job_timeout_s=settings.job_timeout_s,
        grace_s=max(30.0, 6 * settings.batch.tick_s),
    )


def feed_batch(store: BatchStore, settings: Settings, batch_id: str) -> int:
    """One feeder step for the batch, then make sure a tick follows while it runs."""
    tenant = store.tenant(batch_id)

    def submit(job_id: str, request: JobRequest) -> None:
        submit_job(
            store.jobs,
            request,
            timeout_s=settings.job_timeout_s,
            job_id=job_id,
            tenant=tenant,
            batch=batch_id,
            priority=settings.batch.priority,
        )

    started = store.feed(batch_id, submit, feed_limits(settings))
    if started:
        logger.info("batch fed", extra={"batch_id": batch_id, "started": started})
    if store.meta(batch_id)["state"] == "running" and store.claim_tick(
        batch_id, every_s=settings.batch.tick_s
    ):
        app.signature("webctx.batch_feed", args=(batch_id,)).apply_async(
            countdown=settings.batch.tick_s, priority=broker_priority(0)
        )
    return started


def submit_batch(
    store: BatchStore, settings: Settings, tenant: str, name: str, items: list[BatchItem]
) -> tuple[str, bool]:
    """Record (or find) the batch and feed it once; (batch id, True if new). With no
    broker, the local service runs with `settings` (webctx.workers.service_settings)."""
    from webctx.workers.service_settings import work_on_service

    with work_on_service(settings):
        batch_id, created = store.create(tenant, name, items)
        feed_batch(store, settings, batch_id)
    return batch_id, created


@app.task(name="webctx.batch_feed")
def batch_feed(batch_id: str) -> str:
    """Settle a batch's finished items and start the next ones."""
    deps = worker_deps()
    try:
        feed_batch(deps.stores.batches, deps.settings, batch_id)
    except Exception:  # the next tick or item end tries again
        logger.exception("batch feed failed", extra={"batch_id": batch_id})
    return batch_id
