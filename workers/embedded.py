"""The embedded default: an in-process Celery worker (thread pool) on kombu's
in-memory broker, sharing this process's job store and vector store."""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from celery.contrib.testing.worker import TestWorkController, setup_app_for_worker

from webctx.adapters.edge_store import store_holder
from webctx.errors import ConfigError
from webctx.settings import Settings
from webctx.workers.app import app, job_observers, set_deps, start_tasks
from webctx.workers.deps import Deps, build_deps

logger = logging.getLogger("webctx.embedded")


@contextmanager
def embedded_worker(settings: Settings) -> Iterator[Deps]:
    """Run a thread-pool worker in this process for the duration of the block.

    On leaving, the worker is not drained: the in-memory broker dies with the process, so
    whatever is still queued (the deadline watchdog, a cancelled job's tasks) has no one to
    run it anyway, and a graceful Celery shutdown costs seconds of polling. The vector
    store is closed, so the embedded engine is left consistent on disk.
    """
    if not settings.embedded:
        raise ConfigError("the embedded worker runs only when CELERY_BROKER_URL is unset")
    if not str(app.conf.broker_url).startswith("memory://"):
        raise ConfigError(f"embedded mode needs the memory:// broker, not {app.conf.broker_url}")
    with ExitStack() as scratch:
        settings = _free_store(settings, scratch)
        with _running_worker(settings) as deps:
            yield deps


def _free_store(settings: Settings, scratch: ExitStack) -> Settings:
    """`settings`, or, when another local process holds the data directory's vector store
    (one process at a time), settings for a temporary store that `scratch` removes. The
    state server is shared, so its embedding cache still spares the embeddings. An
    explicitly set WEBCTX_QDRANT_PATH is kept, and its holder named in the error."""
    if settings.qdrant_url or "qdrant_path" in settings.model_fields_set:
        return settings
    holder = store_holder(settings.qdrant_path)
    if holder is None:
        return settings
    path = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="webctx-store-")))
    logger.warning("vector store in use by another process: this run uses a temporary one",
                   extra={"pid": holder, "path": str(path)})  # fmt: skip
    return settings.model_copy(update={"qdrant_path": path / "qdrant"})


@contextmanager
def _running_worker(settings: Settings) -> Iterator[Deps]:
    """The worker thread and its collaborators, for the duration of the block."""
    deps = build_deps(settings, start=start_tasks, observers=job_observers())
    deps.open_store()  # before any task, as a store worker does (webctx.workers.app.store_refusal)
    set_deps(deps)
    setup_app_for_worker(app, "WARNING", None)
    worker = TestWorkController(
        app=app,
        pool="threads",
        concurrency=settings.worker_concurrency,
        hostname="embedded@webctx",
        loglevel="WARNING",
        ready_callback=None,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
    )
    thread = threading.Thread(target=worker.start, daemon=True, name="embedded-worker")
    thread.start()
    worker.ensure_started()
    try:
        yield deps
    finally:
        set_deps(None)
        deps.close()
