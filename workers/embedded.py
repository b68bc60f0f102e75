"""The embedded default: an in-process Celery worker (thread pool) on kombu's
in-memory broker, sharing this process's job store and vector store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from celery.contrib.testing.worker import start_worker

from webctx.errors import ConfigError
from webctx.settings import Settings
from workers.app import app
from workers.deps import Deps, build_deps, set_deps


@contextmanager
def embedded_worker(settings: Settings) -> Iterator[Deps]:
    """Run a thread-pool worker in this process for the duration of the block."""
    if not settings.embedded:
        raise ConfigError("the embedded worker runs only when CELERY_BROKER_URL is unset")
    if not str(app.conf.broker_url).startswith("memory://"):
        raise ConfigError(f"embedded mode needs the memory:// broker, not {app.conf.broker_url}")
    deps = build_deps(settings)
    set_deps(deps)
    try:
        with start_worker(
            app,
            pool="threads",
            concurrency=settings.worker_concurrency,
            perform_ping_check=False,
            loglevel="WARNING",
            shutdown_timeout=30.0,
        ):
            yield deps
    finally:
        set_deps(None)
