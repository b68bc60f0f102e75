"""Celery settings, read from webctx's one Settings object.

With no broker configured the broker is the Valkey of the data directory's local service
(webctx/workers/service.py), on its unix socket.
"""

from kombu.entity import Exchange, Queue
from kombu.transport import TRANSPORT_ALIASES

from webctx.errors import ConfigError
from webctx.keys import KeyFamily
from webctx.settings import get_settings
from webctx.workers.service_client import broker_url as local_broker_url

_settings = get_settings()

# kombu takes the transport from a `<transport>+socket://` URL's prefix and ignores
# `broker_transport`; with the transport named and a bare `socket://` URL it reads the
# path as a database. So the fixed transport gets an alias of its own for the socket.
TRANSPORT_ALIASES.setdefault("webctx", "webctx.workers.broker:RedisTransport")
broker_url = _settings.broker_url or "webctx+" + local_broker_url(_settings.data_dir)
if broker_url.startswith("redis://"):
    # kombu's Redis transport, fixed so workers survive a Redis restart (workers/broker.py).
    broker_transport = "webctx.workers.broker:RedisTransport"
if _settings.result_backend:
    result_backend = _settings.result_backend
elif broker_url.startswith("redis"):
    result_backend = broker_url
elif broker_url.startswith("webctx+socket://"):
    result_backend = "redis+" + broker_url.removeprefix("webctx+")
else:
    result_backend = "cache+memory://"

# Tasks are idempotent, so they ack late and are redelivered when a worker dies: acks_late
# alone does not requeue a task whose pool child was SIGKILLed or OOM-killed, hence
# task_reject_on_worker_lost (the job store counts such deliveries: WEBCTX_MAX_DELIVERIES).
task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1
task_ignore_result = True  # results live in the job store; nothing reads task results
result_expires = 3600
worker_cancel_long_running_tasks_on_connection_loss = True
broker_connection_retry_on_startup = True

# Above every task's hard time limit, set alike for broker and result backend: an unacked
# task is redelivered after it even while its first run goes on.
# It also decides how soon the tasks of a SIGKILLed worker run again, so kombu's sweep
# for expired unacked messages runs every few seconds instead of every 100 s (its default
# is an interval of 10 s times a throttle of 10).
_VISIBILITY_S = _settings.visibility_timeout_s
if _settings.task_time_limit_s >= _VISIBILITY_S:
    raise ConfigError(
        f"WEBCTX_TASK_TIME_LIMIT_S ({_settings.task_time_limit_s}) must stay below "
        f"WEBCTX_VISIBILITY_TIMEOUT_S ({_VISIBILITY_S}): a running task would be redelivered"
    )
broker_transport_options = {
    "visibility_timeout": _VISIBILITY_S,
    "unacked_restore_interval": max(1, min(10, _VISIBILITY_S // 5)),
    "unacked_restore_throttle": 1,
    "socket_timeout": 30,  # a half-open broker connection must not block a publish forever
    "socket_connect_timeout": 10,
    "health_check_interval": 10,
    # Batch items' tasks carry a low priority (WEBCTX_BATCH__PRIORITY); a Redis worker
    # polls each queue's priority-0 list (interactive jobs) before the others.
    "priority_steps": [0, 3, 6, 9],
}
result_backend_transport_options = {"visibility_timeout": _VISIBILITY_S}
visibility_timeout = _VISIBILITY_S
task_time_limit = _settings.task_time_limit_s
task_soft_time_limit = max(1, task_time_limit * 9 // 10)
# Every task's retry policy (webctx.workers.policy.StageTask.retry_transient reads it).
task_annotations = {"*": {"max_retries": _settings.task_max_retries,
                          "default_retry_delay": _settings.task_retry_backoff_s,
                          "retry_backoff_max": _settings.task_retry_backoff_max_s}}  # fmt: skip
# Lost broker: keep reconnecting (Redis restarted); running tasks are cancelled and, being
# unacked, come back after the visibility timeout when the broker kept them (it must run
# with AOF: docs/operations.md).
broker_connection_retry = True
broker_connection_max_retries = None  # forever, with Celery's capped backoff

task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]

# One queue per stage, so each can be scaled alone.
STAGE_QUEUES = ("search", "fetch", "render", "embed", "store", "rank")
task_default_queue = "search"
task_default_exchange = "search"
task_default_routing_key = "search"
# Each queue gets its own exchange and routing key: bare Queue(name) objects would all
# bind to the default exchange with the default key, and every message would be
# delivered to every queue.
# On RabbitMQ a queue orders messages by priority only when declared with x-max-priority
# (and an existing queue keeps the arguments it was declared with: delete it to change them).
AMQP = broker_url.startswith(("amqp://", "amqps://", "pyamqp://"))
MAX_PRIORITY = 9  # webctx priorities are 0-9 (webctx.workers.app.broker_priority)
_queue_arguments = {"x-max-priority": MAX_PRIORITY} if AMQP else None
# Re-index runs of the persistent index get their own queue (docs/index.md): they take
# minutes and must not delay research jobs' stages.
REINDEX_QUEUE = "reindex"
task_queues = [
    Queue(name, Exchange(name), routing_key=name, queue_arguments=_queue_arguments)
    for name in (*STAGE_QUEUES, REINDEX_QUEUE)
]
task_routes = {
    "webctx.plan": {"queue": "search"},
    "webctx.search": {"queue": "search"},
    "webctx.fetch": {"queue": "fetch"},
    # Script-filled pages: a headless browser per worker process (docs/architecture.md).
    "webctx.render": {"queue": "render"},
    "webctx.embed": {"queue": "embed"},
    "webctx.embed_question": {"queue": "embed"},
    # store and rank are the only stages that open the vector store (the embedded engine
    # admits one process: give it `-Q store,rank`, and every other queue to any worker).
    "webctx.store": {"queue": "store"},
    # A one-off job's pages indexed after its answer: embedding and storing in one task.
    "webctx.index_later": {"queue": "store"},
    "webctx.rank": {"queue": "rank"},
    # An index search reads the vector store as rank does, and must not wait behind re-index
    # runs; the rest of the index's tasks re-index.
    "webctx.index.search": {"queue": "rank"},
    "webctx.index.*": {"queue": REINDEX_QUEUE},
}
# Celery beat only sends ticks; the schedule itself (each source's next due time) lives in
# Redis (webctx/index/sources.py), so it survives restarts, and each due run is claimed with
# SET NX: a second beat started by mistake doubles the ticks, never the runs.
beat_schedule = {
    "webctx-index-tick": {
        "task": "webctx.index.tick",
        "schedule": _settings.index.tick_s,
        "options": {"expires": _settings.index.tick_s},  # a backlog of ticks is pointless
    },
    # Held jobs of tenants with free slots (freed by a process that sends no tasks, or
    # lapsed) are published here: idempotent, so a doubled beat only doubles the ticks.
    "webctx-admission-tick": {
        "task": "webctx.admission_tick",
        "schedule": _settings.admission.tick_s,
        "options": {"expires": _settings.admission.tick_s},
    },
}
task_routes["webctx.batch_feed"] = {"queue": "rank"}
task_routes["webctx.admission_tick"] = {"queue": "rank"}
task_inherit_parent_priority = True  # a batch item's tasks all keep its low priority
imports = ["webctx.workers.batch"]  # the batch feeder task and its job observer
worker_hijack_root_logger = False

# What Celery and kombu keep in a Redis broker and result backend (webctx's own keys are in
# webctx/keys.py): each queue's list, and one more list per priority step above 0; kombu's
# bindings and its book of unacked messages; control replies; the few results kept.
_KOMBU = "celery (kombu's Redis transport)"
_PRIORITY_SEP = "\x06\x16"  # kombu's separator of a queue's priority lists


def queue_lists() -> list[str]:
    """Every Redis list of the queues: one per queue and priority step."""
    steps = broker_transport_options["priority_steps"]
    assert isinstance(steps, list)
    return [q.name if step == 0 else f"{q.name}{_PRIORITY_SEP}{step}"
            for q in task_queues for step in steps]  # fmt: skip


REDIS_BROKER_KEYS = (
    *(KeyFamily(q.name, _KOMBU, "external", "shared", "the queue's waiting messages")
      for q in task_queues),
    *(KeyFamily(q.name + _PRIORITY_SEP + "{priority}", _KOMBU, "external", "shared",
                "the queue's messages of one priority step") for q in task_queues),
    KeyFamily("_kombu.binding.{exchange}", _KOMBU, "external", "shared", "an exchange's queues"),
    KeyFamily("_kombu.binding_permanent.{exchange}", _KOMBU, "external", "shared",
              "the bindings that never expire"),
    KeyFamily("_kombu.binding_deadlines", _KOMBU, "external", "shared",
              "when the other bindings expire"),
    KeyFamily("unacked", _KOMBU, "external", "shared", "messages delivered, not yet acked"),
    KeyFamily("unacked_index", _KOMBU, "external", "shared", "when each was delivered"),
    KeyFamily("unacked_mutex", _KOMBU, "external", "shared", "the restore sweep's lock"),
    KeyFamily("{reply_id}.reply.celery.pidbox", _KOMBU, "external", "shared",
              "replies to a control command (mingle at start, add_consumer)"),
    KeyFamily("celery-task-meta-{task_id}", "celery (result backend)", "external", "shared",
              "a task result somebody reads (index search through a worker)"),
)  # fmt: skip
