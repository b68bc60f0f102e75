"""The Celery application (`celery -A workers.app worker`)."""

from celery import Celery

from workers.metrics import install_worker_signals

app = Celery("webctx", include=["workers.tasks", "workers.index_tasks"])
app.config_from_object("celeryconfig")
install_worker_signals(app)  # stage metrics, job_id/task_id on log lines, optional tracing


def broker_priority(priority: int | None) -> int | None:
    """The broker's priority for a webctx priority: 0 (served first, interactive jobs'
    default) to 9 (batch items), as on Redis; AMQP serves the highest number first."""
    if not str(app.conf.broker_url).startswith(("amqp://", "amqps://", "pyamqp://")):
        return priority
    return 9 - (priority or 0)
