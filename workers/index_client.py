"""What clients (CLI, API, MCP) ask of the persistent index's tasks, sent by name: a
search, a manual re-index run, a removed source's pages dropped. Importing this module
loads none of the re-index code (webctx/workers/index_tasks.py runs in workers)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from celery.exceptions import TimeoutError as ResultTimeout
from celery.result import AsyncResult

from webctx.errors import ProviderUnavailable
from webctx.index.runs import RefreshRuns
from webctx.index.search import IndexHit
from webctx.index.sources import Source
from webctx.settings import Settings
from webctx.workers.app import app, has_deps
from webctx.workers.service_settings import work_on_service


def forget_source(tenant: str, source_id: str) -> None:
    """Have a worker drop a removed source's pages (`webctx.index.forget`)."""
    app.signature("webctx.index.forget", args=(tenant, source_id)).apply_async()


def local_store(settings: Settings) -> bool:
    """True when this process may open the vector store itself: a Qdrant server, or this
    process is a worker (the embedded engine is the worker's: the local service's)."""
    return bool(settings.qdrant_url) or has_deps()


def run_search(
    settings: Settings,
    *,
    tenant: str,
    query: str,
    limit: int = 10,
    filters: dict[str, str | None] | None = None,
    timeout_s: float = 30.0,
) -> list[IndexHit]:
    """Search the index here, or through a worker when it holds the embedded engine (the
    local service: with `settings`, webctx.workers.service_settings)."""
    filters = filters or {}
    if local_store(settings):
        from webctx.index.search import search_index
        from webctx.workers.app import worker_deps
        from webctx.workers.index_tasks import index_context

        return search_index(query, tenant=tenant, ctx=index_context(worker_deps()),
                            limit=limit, **filters)  # fmt: skip
    result = app.signature("webctx.index.search", args=(tenant, query, limit, filters))
    # Expires when the caller gives up: a worker started after that drops it (without
    # mingle a new worker does not learn of the revoke below).
    with work_on_service(settings):
        pending = result.apply_async(expires=timeout_s)
    first_wait = min(NO_WORKER_CHECK_S, timeout_s)
    try:
        raw = pending.get(timeout=first_wait)
    except ResultTimeout:
        queue = str(app.conf.task_routes["webctx.index.search"]["queue"])
        # The local service's worker may still be loading its model: it will answer.
        if not settings.embedded and not consumers_of(queue):
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
    runs: RefreshRuns, tenant: str, sources: Sequence[Source], *, settings: Settings
) -> str:
    """Re-index `tenant`'s `sources` now, outside the schedule (with no broker, by the
    local service running `settings`); returns the run id to wait on."""
    if any(source.tenant != tenant for source in sources):
        raise ValueError("a run re-indexes the sources of one tenant")
    with work_on_service(settings):
        run_id, requested_at = runs.start(tenant, len(sources)), time.time()
        for source in sources:
            app.signature(
                "webctx.index.refresh", args=(source.tenant, source.source_id, run_id, requested_at)
            ).apply_async()
    return run_id


def run_transfer(
    settings: Settings, direction: str, path: str, *, timeout_s: float
) -> dict[str, Any]:
    """Export (or import) the index at `path` where the vector store is open: here for a
    Qdrant server, else on the worker holding the embedded engine (the local service), whose
    machine the path is on. InvalidRequest, Conflict or ProviderError for what failed."""
    from webctx.errors import Conflict, InvalidRequest, ProviderError

    if local_store(settings):
        from webctx.adapters.point_io import point_io
        from webctx.index.transfer import export_index, import_index
        from webctx.workers.app import worker_deps
        from webctx.workers.deps import state_client

        deps, client = worker_deps(), state_client(settings)
        run = export_index if direction == "export" else import_index
        try:
            return run(Path(path), points=point_io(deps.engine.store), client=client)
        finally:
            client.close()
    with work_on_service(settings):
        pending = app.signature("webctx.index.transfer", args=(direction, path)).apply_async()
    try:
        result = cast(dict[str, Any], pending.get(timeout=timeout_s))
    except ResultTimeout:
        _stop_waiting(pending)
        raise ProviderUnavailable(
            f"index {direction}: no answer from the workers within {timeout_s:g} s"
        ) from None
    if "error" in result:
        kind, message = str(result.get("kind")), str(result["error"])
        if kind in ("InvalidRequest", "Conflict"):
            raise (InvalidRequest if kind == "InvalidRequest" else Conflict)(message)
        raise ProviderError("index", message)
    return result
