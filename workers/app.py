"""The Celery application (`celery -A workers.app worker`)."""

from celery import Celery

from workers.metrics import install_worker_signals

app = Celery("webctx", include=["workers.tasks", "workers.index_tasks"])
app.config_from_object("celeryconfig")
install_worker_signals(app)  # stage metrics, job_id/task_id on log lines, optional tracing
