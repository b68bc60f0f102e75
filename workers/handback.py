"""How the local service stops within seconds, whatever its tasks are doing, and how the
next one takes the dead one's tasks at once.

Celery's warm shutdown waits for every running task: a fetch trickling an 80 s page held
`webctx service stop` for as long (and, past the stop's patience, the service was
killed). A thread cannot be interrupted, but its task need not be waited for: every task
is idempotent and acks late, so its message can go back to its queue while it runs, and
the next service runs it again. So the service's pool (`ServicePool`, a thread pool)
gives its running tasks `STOP_GRACE_S` to finish once the worker stops consuming, and
then stops waiting: the channel's close that follows puts every message still unacked
(the tasks left running, the held countdowns) back at the front of its queue, and the
service leaves without waiting for their threads (`os._exit`, after its own clean-up:
webctx/cli/service.py). A task handed back this way did not die with its worker, so its
delivery is not counted as such (`WEBCTX_MAX_DELIVERIES`).

A service that died (SIGKILL, OOM) hands nothing back; its messages stay unacked under
its holder id (webctx/workers/liveness.py). The next service holds the data directory's
lock, which proves its predecessors dead, and it is the only consumer of its Valkey: it
requeues every holder's messages before it consumes (`requeue_dead_services`), instead of
waiting `WEBCTX_WORKER_LOST_AFTER_S`, and ends the single-flight download claims they
left (webctx/jobs/caches.py), which a redelivered fetch would otherwise wait out as if
another job were downloading its page (a minute and more).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, wait
from typing import Any

from celery.concurrency.thread import ApplyResult, TaskPool

from webctx.workers.liveness import reap

logger = logging.getLogger("webctx.service")

STOP_GRACE_S = 3.0
"""How long a stopping service waits for its running tasks: an embed, a store or a rank
ends well within it; a download may not, and is handed back."""
DELIVERY_STAGES = {"webctx.fetch": "fetch", "webctx.render": "render",
                   "webctx.embed": "embed", "webctx.store": "store"}  # fmt: skip
"""The tasks that count their deliveries (webctx/jobs/pages.py), and the stage they count
under."""


class ServicePool(TaskPool):  # type: ignore[misc]  # Celery is untyped
    """The local service's thread pool: its stop waits `STOP_GRACE_S` for running tasks,
    then leaves the rest to be handed back."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._running: set[Future[Any]] = set()
        self._lock = threading.Lock()

    def on_apply(self, *args: Any, **kwargs: Any) -> ApplyResult:
        result = super().on_apply(*args, **kwargs)
        with self._lock:
            self._running.add(result.f)
        result.f.add_done_callback(self._done)
        return result

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            self._running.discard(future)

    def on_stop(self) -> None:
        with self._lock:
            running = set(self._running)
        started = time.monotonic()
        wait(running, timeout=STOP_GRACE_S)
        left = [f for f in running if not f.done()]
        if left:
            forget_deliveries()
        self.executor.shutdown(wait=False, cancel_futures=True)
        logger.info("service stopping: running tasks handed back", extra={
            "waited_s": round(time.monotonic() - started, 2), "tasks": len(left)})  # fmt: skip


def forget_deliveries() -> int:
    """Clear the delivery counts of the tasks still running (their messages go back to
    their queues as the worker's channel closes): how many tasks that is."""
    from celery.worker import state

    from webctx.workers.app import worker_deps

    requests = [r for r in list(state.active_requests) if not r.acknowledged]
    jobs = worker_deps().engine.jobs
    for request in requests:
        stage = DELIVERY_STAGES.get(request.name)
        if stage is not None and len(request.args) >= 2:
            try:
                jobs.end_delivery(str(request.args[0]), stage, str(request.args[1]))
            except Exception:  # Valkey going away: the next delivery counts one too many
                logger.warning("delivery count not cleared", exc_info=True)
    return len(requests)


def requeue_dead_services(app: Any) -> dict[str, int]:
    """Before this service consumes: every message a dead service held unacked, back at
    the front of its queue (holder id -> count), and the download claims its tasks left
    ended (their next delivery would wait them out)."""
    from webctx.workers.app import worker_deps

    with app.connection_for_write() as conn:
        restored = reap(conn.default_channel, lost_after_s=0)
    claims = worker_deps().engine.page_cache.release_all_downloads()
    for holder, count in restored.items():
        logger.warning("tasks of a dead service requeued",
                       extra={"holder": holder, "messages": count})  # fmt: skip
    if claims:
        logger.info("download claims of a dead service ended", extra={"claims": claims})
    return restored
