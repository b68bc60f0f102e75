"""The persistent index's tasks: the beat's tick and one source's re-index (`reindex`
queue), a search where the vector store is open (`rank` queue), a removed source's pages.

Beat sends `webctx.index.tick` every WEBCTX_INDEX__TICK_S; the tick claims due sources in
the registry (each due time exactly once, however many beats or redeliveries send ticks)
and starts one `webctx.index.refresh` per claimed source. A run lock per source keeps a
scheduled run and a manual `webctx sources refresh` from interleaving on the same pages
(both it and the manual runs' records are kept by `webctx.index.runs`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import Task

from webctx.errors import ConfigError
from webctx.index.refresh import IndexContext, optimize_if_due, refresh_source, sweep
from webctx.index.search import search_index
from webctx.protocols import IndexStore
from webctx.workers.app import app, worker_deps
from webctx.workers.deps import Deps

logger = logging.getLogger(__name__)


def index_context(deps: Deps) -> IndexContext:
    """The re-index collaborators of this process's Deps."""
    engine, settings = deps.engine, deps.settings
    store = engine.store
    if not isinstance(store, IndexStore):
        raise ConfigError("the configured vector store cannot serve the index")
    return IndexContext(
        records=deps.stores.records,
        stored_pages=engine.stored,
        fetcher=engine.fetcher,
        embedder=engine.embedder,
        store=store,
        chunking=settings.chunk,
        embedding=settings.embed,
        settings=settings.index,
        cache=engine.cache,
        limiter=engine.limiter,
        extract_timeout_s=settings.fetch.extract_timeout_s,
        pdf=engine.pdf,
        fetch=settings.fetch,
    )


@app.task(name="webctx.index.tick")
def tick() -> int:
    """Start a refresh of every due source this tick won; sweep old points."""
    deps = worker_deps()
    claimed_at = time.time()
    due = deps.stores.sources.claim_due(now=claimed_at)
    for source in due:
        args = (source.tenant, source.source_id, None, claimed_at)
        app.signature("webctx.index.refresh", args=args).apply_async()
    if due:
        logger.info("sources due", extra={"sources": len(due)})
    return len(due)


RUN_WAIT_S = 1.0
"""How often a manual run's refresh looks again at a source another run holds."""


@app.task(name="webctx.index.refresh", bind=True)
def refresh(
    self: Task,
    tenant: str,
    source_id: str,
    run_id: str | None = None,
    requested_at: float | None = None,
) -> str:
    """Re-index one source. While another run of it holds the lock, a scheduled refresh
    is skipped; a manual run's (`run_id`) comes back every `RUN_WAIT_S` until the lock is
    free and then refreshes, so the run reports done only once the source is indexed as of
    the caller's request (up to the task time limit, then it reports the source busy).
    Pages another run confirmed after `requested_at` (when this run was asked for) are
    not asked again: a run waiting behind beat's first run of a source just added re-asks
    none of the pages that run confirmed after the request."""
    deps = worker_deps()
    stores = deps.stores
    source = stores.sources.get(tenant, source_id)
    report: dict[str, Any] = {"error": "source removed"}
    if source is not None:
        holder, ttl_s = run_id or "scheduled", deps.settings.task_time_limit_s
        if stores.runs.lock(tenant, source_id, holder=holder, ttl_s=ttl_s):
            try:
                ctx, started_at = index_context(deps), time.time()
                report = refresh_source(source, ctx, confirmed_since=requested_at).as_dict()
                stores.sources.record_run(source, report, started_at=started_at)
                if report.get("chunks_embedded"):
                    optimize_if_due(ctx.store)
            finally:
                stores.runs.unlock(tenant, source_id)
        elif run_id and self.request.retries * RUN_WAIT_S < ttl_s:
            raise self.retry(countdown=RUN_WAIT_S, max_retries=None)
        else:
            report = {"error": "another run of this source is in progress"}
    if run_id:
        stores.runs.report(run_id, source_id, report)
    return source_id


@app.task(name="webctx.index.search", ignore_result=False)
def search(tenant: str, query: str, limit: int, filters: dict[str, str | None]) -> list[Any]:
    """Index search where the vector store is open (the embedded engine's one process)."""
    hits = search_index(query, tenant=tenant, ctx=index_context(worker_deps()), limit=limit,
                        **filters)  # fmt: skip
    return [h.model_dump() for h in hits]


@app.task(name="webctx.index.forget")
def forget(tenant: str, source_id: str) -> int:
    """Drop a removed source's pages, then sweep what nothing points at."""
    ctx = index_context(worker_deps())
    dropped = ctx.records.drop_source(tenant, source_id, store=ctx.store,
                                    grace_s=ctx.settings.grace_s)  # fmt: skip
    sweep(ctx)
    return dropped


TRANSFER_LIMIT_S = 6 * 3600
"""A transfer's time limit: an export or import of millions of points takes many minutes."""


# Acked on receipt: it runs past the broker's visibility timeout, and the caller, who
# waits for it, runs it again rather than a redelivery while it still runs.
@app.task(name="webctx.index.transfer", ignore_result=False, acks_late=False,
          time_limit=TRANSFER_LIMIT_S, soft_time_limit=TRANSFER_LIMIT_S - 60)  # fmt: skip
def transfer(direction: str, path: str) -> dict[str, Any]:
    """Export the index to, or import it from, `path` on this worker's machine, where the
    embedded engine is open; the counts, or {"error": ...} for bad input."""
    from pathlib import Path

    from webctx.adapters.point_io import point_io
    from webctx.errors import WebctxError
    from webctx.index.transfer import export_index, import_index
    from webctx.workers.deps import state_client

    deps = worker_deps()
    run = export_index if direction == "export" else import_index
    client = state_client(deps.settings)
    try:
        return run(Path(path), points=point_io(deps.engine.store), client=client)
    except WebctxError as exc:
        return {"error": str(exc), "kind": type(exc).__name__}
    finally:
        client.close()
