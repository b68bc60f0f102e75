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
from collections.abc import Sequence
from typing import Any, cast

from celery.exceptions import TimeoutError as ResultTimeout
from celery.result import AsyncResult

from webctx.errors import ConfigError, ProviderUnavailable
from webctx.index.refresh import IndexContext, optimize_if_due, refresh_source, sweep
from webctx.index.runs import RefreshRuns
from webctx.index.search import IndexHit, search_index
from webctx.index.sources import Source
from webctx.protocols import IndexStore
from webctx.settings import Settings
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
    due = deps.stores.sources.claim_due()
    for source in due:
        app.signature("webctx.index.refresh", args=(source.tenant, source.source_id)).apply_async()
    if due:
        logger.info("sources due", extra={"sources": len(due)})
    return len(due)


@app.task(name="webctx.index.refresh")
def refresh(tenant: str, source_id: str, run_id: str | None = None) -> str:
    """Re-index one source (skipped while another run of it holds the lock)."""
    deps = worker_deps()
    stores = deps.stores
    source = stores.sources.get(tenant, source_id)
    report: dict[str, Any] = {"error": "source removed"}
    if source is not None:
        holder, ttl_s = run_id or "scheduled", deps.settings.task_time_limit_s
        if stores.runs.lock(tenant, source_id, holder=holder, ttl_s=ttl_s):
            try:
                ctx = index_context(deps)
                report = refresh_source(source, ctx).as_dict()
                stores.sources.record_run(source, report)
                if report.get("chunks_embedded"):
                    optimize_if_due(ctx.store)
            finally:
                stores.runs.unlock(tenant, source_id)
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


# -- entry points' helpers (CLI, API, MCP) -----------------------------------------------------
def local_store(settings: Settings) -> bool:
    """True when this process may open the vector store itself (no broker, or a server)."""
    return settings.embedded or bool(settings.qdrant_url)


def run_search(
    settings: Settings,
    *,
    tenant: str,
    query: str,
    limit: int = 10,
    filters: dict[str, str | None] | None = None,
    timeout_s: float = 30.0,
) -> list[IndexHit]:
    """Search the index here, or through a worker when it holds the embedded engine."""
    filters = filters or {}
    if local_store(settings):
        return search_index(query, tenant=tenant, ctx=index_context(worker_deps()),
                            limit=limit, **filters)  # fmt: skip
    result = app.signature("webctx.index.search", args=(tenant, query, limit, filters))
    pending = result.apply_async()
    first_wait = min(NO_WORKER_CHECK_S, timeout_s)
    try:
        raw = pending.get(timeout=first_wait)
    except ResultTimeout:
        queue = str(app.conf.task_routes["webctx.index.search"]["queue"])
        if not consumers_of(queue):
            pending.revoke()
            _stop_waiting(pending)
            raise ProviderUnavailable(
                f"index search: no worker consumes the {queue!r} queue; start one with "
                f"`webctx worker` (all queues) or `webctx worker -Q {queue}`"
            ) from None
        try:
            raw = pending.get(timeout=max(timeout_s - first_wait, 0.1))
        except ResultTimeout:
            _stop_waiting(pending)
            raise ProviderUnavailable(
                f"index search: no answer from the {queue!r} workers within {timeout_s:g} s"
            ) from None
    return [IndexHit.model_validate(h) for h in cast(list[Any], raw)]


NO_WORKER_CHECK_S = 3.0
"""A search not answered by then asks the workers whether any consumes its queue."""


def _stop_waiting(pending: AsyncResult) -> None:
    """Unsubscribe from a result given up on now, not in its finaliser: one that runs at
    interpreter exit finds Redis' client half torn down and prints a traceback."""
    pending.backend.remove_pending_result(pending)
    pending.backend = None


def consumers_of(queue: str, timeout_s: float = 1.0) -> list[str]:
    """Node names of the live workers that consume `queue` (a broadcast, `timeout_s` long)."""
    replies = app.control.inspect(timeout=timeout_s).active_queues() or {}
    return sorted(node for node, queues in replies.items()
                  if any(q.get("name") == queue for q in queues or ()))  # fmt: skip


def start_refresh(
    settings: Settings, runs: RefreshRuns, tenant: str, sources: Sequence[Source]
) -> str:
    """Re-index `tenant`'s `sources` now, outside the schedule; returns the run id to wait on."""
    if any(source.tenant != tenant for source in sources):
        raise ValueError("a run re-indexes the sources of one tenant")
    run_id = runs.start(tenant, len(sources))
    for source in sources:
        if settings.embedded:  # no broker: run here, now
            refresh.run(source.tenant, source.source_id, run_id)
        else:
            app.signature(
                "webctx.index.refresh", args=(source.tenant, source.source_id, run_id)
            ).apply_async()
    return run_id
