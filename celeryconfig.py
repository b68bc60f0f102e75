"""Celery's conventional settings module, for commands run from a checkout.

`celery --config celeryconfig ...` (or any tool that looks for a top-level `celeryconfig`)
finds webctx's settings here. They live in `workers/celeryconfig.py`, installed as
`webctx.workers.celeryconfig`, which is what the app loads; this file re-exports them and is
not installed (a top-level `celeryconfig` in site-packages would collide with any other
project's).
"""

from webctx.workers.celeryconfig import *  # noqa: F403
