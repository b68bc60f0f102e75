"""The embedded default: an in-process Celery worker (thread pool) on kombu's
in-memory broker, sharing this process's job store and vector store."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from celery.contrib.testing.worker import TestWorkController, setup_app_for_worker

from webctx.errors import ConfigError
from webctx.settings import Settings
from webctx.workers.app import app, job_observers, set_deps, start_tasks
from webctx.workers.deps import Deps, build_deps


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
