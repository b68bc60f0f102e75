"""The Celery application (`celery -A workers.app worker`)."""

import logging
from typing import Any

from celery import Celery, signals

from celeryconfig import INDEX_QUEUE
from webctx import tokens
from webctx.allocator import return_freed_memory
from webctx.errors import WebctxError
from workers.deps import worker_deps
from workers.metrics import install_worker_signals

app = Celery("webctx", include=["workers.tasks", "workers.index_tasks"])
app.config_from_object("celeryconfig")
install_worker_signals(app)  # stage metrics, job_id/task_id on log lines, optional tracing

logger = logging.getLogger("webctx.worker")

TOKEN_QUEUES = frozenset({"embed", "store", "rank", INDEX_QUEUE})
"""Queues whose tasks count tokens: chunking, embedding (the question too), re-indexing."""


def load_tokenizer(queues: set[str]) -> bool:
    """Load the tokenizer now when a worker consuming `queues` will count tokens.

    Its tables (about 35 MB) are a fixed cost: loaded at start, a worker's memory is as
    large after its first minute as after its ten-thousandth task, so it can be sized
    (and its growth watched) from the start, and no task waits for the load."""
    if not queues & TOKEN_QUEUES:
        return False
    tokens.encoding()
    logger.info("tokenizer loaded", extra={"encoding": tokens.ENCODING_NAME})
    return True


def open_store(queues: set[str], pool: type) -> bool:
    """Open the vector store now on a worker that stores, unless its pool forks (each
    child opens its own). Opening it checks whether it is empty (`Deps.store`), and that
    must happen before this worker's first task: pages marked stored in a wiped store
    would otherwise be skipped."""
    if "store" not in queues or "prefork" in pool.__module__:
        return False
    try:
        opened = worker_deps().open_store()
    except WebctxError as exc:  # the first store task reports it, as without this
        logger.error("vector store not opened", extra={"exc": str(exc)})
        return False
    logger.info("vector store opened", extra={"store": type(opened).__name__})
    return True


@signals.celeryd_after_setup.connect(weak=False)
def _prepare(instance: Any = None, **_: Any) -> None:
    """Main worker process, once -Q applies and logging is set up, before the pool starts
    (forked children share the tokenizer's tables)."""
    if instance is None:
        return
    applied = return_freed_memory()  # before the pool's threads or children exist
    settings = ", ".join(f"{name}={value}" for name, value in applied.items()) or "none"
    logger.info("allocator set to return freed memory: %s", settings)
    queues = set(instance.app.amqp.queues.consume_from)
    load_tokenizer(queues)
    open_store(queues, instance.pool_cls)


def broker_priority(priority: int | None) -> int | None:
    """The broker's priority for a webctx priority: 0 (served first, interactive jobs'
    default) to 9 (batch items), as on Redis; AMQP serves the highest number first."""
    if not str(app.conf.broker_url).startswith(("amqp://", "amqps://", "pyamqp://")):
        return priority
    return 9 - (priority or 0)
