"""The Celery application (`celery -A workers.app worker`)."""

from celery import Celery

app = Celery("webctx", include=["workers.tasks"])
app.config_from_object("celeryconfig")
