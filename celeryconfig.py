"""Celery settings, read from webctx's one Settings object.

With no broker configured the app runs on kombu's in-memory transport inside the
`webctx research` process (the embedded default).
"""

from kombu.entity import Exchange, Queue

from webctx.settings import get_settings

_settings = get_settings()

broker_url = _settings.broker_url or "memory://localhost/"
result_backend = _settings.result_backend or (
    _settings.broker_url
    if _settings.broker_url and _settings.broker_url.startswith("redis")
    else "cache+memory://"
)

# Tasks are idempotent, so they ack late and are redelivered when a worker dies (TRAPS 1).
task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1
task_ignore_result = True  # results live in the job store; nothing reads task results
result_expires = 3600
worker_cancel_long_running_tasks_on_connection_loss = True
broker_connection_retry_on_startup = True

# Above every task's hard time limit (TRAPS 2), set alike for broker and result backend.
_VISIBILITY_S = 1800
broker_transport_options = {"visibility_timeout": _VISIBILITY_S}
result_backend_transport_options = {"visibility_timeout": _VISIBILITY_S}
task_time_limit = 600
task_soft_time_limit = 540

task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]

# One queue per stage, so each can be scaled alone.
STAGE_QUEUES = ("search", "fetch", "embed", "rank")
task_default_queue = "search"
task_default_exchange = "search"
task_default_routing_key = "search"
# Each queue gets its own exchange and routing key: bare Queue(name) objects would all
# bind to the default exchange with the default key, and every message would be
# delivered to every queue.
task_queues = [Queue(name, Exchange(name), routing_key=name) for name in STAGE_QUEUES]
task_routes = {
    "webctx.plan": {"queue": "search"},
    "webctx.search": {"queue": "search"},
    "webctx.fetch": {"queue": "fetch"},
    "webctx.embed": {"queue": "embed"},
    "webctx.rank": {"queue": "rank"},
}
worker_hijack_root_logger = False
