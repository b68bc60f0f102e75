"""The Celery application (`celery -A workers.app worker`)."""

import logging
from typing import Any

from celery import Celery, signals

from celeryconfig import INDEX_QUEUE
from webctx import tokens
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


@signals.celeryd_after_setup.connect(weak=False)
def _load_tokenizer(instance: Any = None, **_: Any) -> None:
    """Main worker process, once -Q applies and logging is set up, before the pool starts
    (forked children share the tables)."""
    queues = instance.app.amqp.queues.consume_from if instance is not None else {}
    load_tokenizer(set(queues))


def broker_priority(priority: int | None) -> int | None:
    """The broker's priority for a webctx priority: 0 (served first, interactive jobs'
    default) to 9 (batch items), as on Redis; AMQP serves the highest number first."""
    if not str(app.conf.broker_url).startswith(("amqp://", "amqps://", "pyamqp://")):
        return priority
    return 9 - (priority or 0)
