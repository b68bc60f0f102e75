"""The thin Celery layer: the app, its tasks and how a job fans out."""
