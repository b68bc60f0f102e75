"""Tasks of a dead worker back in their queues within a minute, on a Redis broker.

kombu's Redis transport keeps each delivered, unacked message in its `unacked` hash and
requeues it only once the visibility timeout has passed (1,800 s, above the 600 s task
time limit, so that a healthy long task is never delivered twice). A worker SIGKILLed or
OOM-killed as a whole (a pool child's death is handled by `task_reject_on_worker_lost`)
would leave its tasks, and its jobs, waiting that long.

So each worker process takes a holder id, records the delivery tag of every message it
takes in its own set (`_QoS.append` in webctx/workers/broker.py, in the pipeline that
writes kombu's `unacked` entry, and removed with it on ack, reject or restore), and beats:
every `lost_after / 3` seconds it writes the Redis server's time as its score in
`webctx:workers`. Any live worker that finds a score older than `lost_after` claims that
holder (its score moved to now: a lease, so two workers do not both restore it, and one
that dies mid-restore leaves it to the next) and requeues exactly the holder's messages
through kombu's own `restore_by_tag` (one WATCH/MULTI transaction per message: it moves
the message to the front of its queue, under kombu's priority-list naming and bindings,
and removes it from `unacked`, so it is restored once even when the visibility sweep or
another worker races it). A killed worker's tasks run again `lost_after` to
`4/3 * lost_after` seconds after its last beat.

The cost: a worker that stops beating for `lost_after` seconds while alive (SIGSTOP, a
suspended VM, a Redis outage longer than that on its side only) has its tasks delivered
again while they run; tasks are idempotent, so that costs work, not correctness. A worker
reaps only after it has itself beaten without error for `lost_after` seconds, so the first
worker back after a Redis outage does not take every other live worker for dead.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import redis

logger = logging.getLogger("webctx.worker")

WORKERS_KEY = "webctx:workers"
HELD_TTL_S = 24 * 3600
"""A held set outlives any task (time limit) and any countdown the worker holds (the job
watchdog); each beat renews it, so only a holder nobody reaps lets it expire."""
_REAP_BATCH = 16

WORKER_ID = uuid.uuid4().hex
"""This process's holder id: a restarted worker is a new holder, never its dead self."""


def held_key(worker_id: str) -> str:
    """The set of delivery tags a worker holds unacked."""
    return f"webctx:worker:{worker_id}:held"


_BEAT = """
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], t[1] + t[2] / 1000000, ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""

# Holders whose last beat is older than ARGV[1] seconds, claimed for ARGV[1] more seconds.
_CLAIM = """
local t = redis.call('TIME')
local now = t[1] + t[2] / 1000000
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ARGV[1], 'LIMIT', 0, ARGV[2])
for _, id in ipairs(dead) do redis.call('ZADD', KEYS[1], now, id) end
return dead
"""

_active = threading.Event()


def recording() -> bool:
    """True in a worker process that beats: its deliveries go into its held set."""
    return _active.is_set()


def beat(client: redis.Redis, worker_id: str = WORKER_ID) -> None:
    """Say `worker_id` is alive, by the Redis server's clock; renew its held set."""
    client.eval(_BEAT, 2, WORKERS_KEY, held_key(worker_id), worker_id, HELD_TTL_S)


def reap(channel: Any, *, lost_after_s: float) -> dict[str, int]:
    """Requeue the messages of every holder silent for `lost_after_s`: holder id -> count.

    `channel` is a channel of webctx's Redis transport (kombu's restore honours its
    priority steps, separator and bindings)."""
    client = channel.client
    restored: dict[str, int] = {}
    while dead := client.eval(_CLAIM, 1, WORKERS_KEY, lost_after_s, _REAP_BATCH):
        for raw in dead:
            worker_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            tags = client.smembers(held_key(worker_id))
            for tag in tags:
                channel.qos.restore_by_tag(tag, client)
            client.delete(held_key(worker_id))
            client.zrem(WORKERS_KEY, worker_id)
            restored[worker_id] = len(tags)
        if len(dead) < _REAP_BATCH:
            break
    return restored


def forget(client: redis.Redis, worker_id: str = WORKER_ID) -> bool:
    """At a clean stop: leave `webctx:workers` when nothing is held any more (else the
    next reap requeues what the stop left unacked). True when it left."""
    if client.scard(held_key(worker_id)):
        return False
    client.zrem(WORKERS_KEY, worker_id)
    return True


class Heartbeat:
    """The beating and reaping thread of one worker process."""

    def __init__(self, connect: Any, *, lost_after_s: float) -> None:
        self._connect = connect  # () -> kombu Connection to the broker
        self.lost_after_s = lost_after_s
        self.interval_s = lost_after_s / 3
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-heartbeat", daemon=True)

    def record(self) -> None:
        """Record this process's deliveries from now on (before the worker consumes)."""
        _active.set()

    def start(self) -> None:
        """Beat (and reap) in a thread, from now on: once the worker consumes, so that a
        prefork pool's children are forked before the thread exists."""
        _active.set()
        self._thread.start()

    def stop(self) -> None:
        """Stop beating; leave the registry when nothing is held."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 5)
        try:
            with self._connect() as conn:
                forget(conn.default_channel.client)
        except Exception:  # a stop must not fail on a lost broker
            logger.warning("worker heartbeat: could not leave the registry", exc_info=True)

    def _run(self) -> None:
        conn: Any = None
        healthy_since: float | None = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self._connect()
                channel = conn.default_channel
                beat(channel.client)
                now = time.monotonic()
                healthy_since = now if healthy_since is None else healthy_since
                if now - healthy_since >= self.lost_after_s:
                    self._log(reap(channel, lost_after_s=self.lost_after_s))
            except Exception:  # keep beating through broker outages
                logger.warning("worker heartbeat failed; retrying", exc_info=True)
                healthy_since = None
                if conn is not None:
                    _close_quietly(conn)
                conn = None
            self._stop.wait(self.interval_s)
        if conn is not None:
            _close_quietly(conn)

    @staticmethod
    def _log(restored: dict[str, int]) -> None:
        for worker_id, count in restored.items():
            logger.warning("tasks of a lost worker requeued",
                           extra={"holder": worker_id, "messages": count})  # fmt: skip


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # already lost
        logger.debug("closing the heartbeat's broker connection failed", exc_info=True)
