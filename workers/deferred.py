"""Deferred work makes way for interactive work in the same worker.

A one-off job's pages are indexed after its answer (`webctx.index_later`): with the local
model that is every chunk of every page through the embedder, on the machine's cores.
Sent as one task per page, a job's deferred pages all started at once in the local
service's threads the moment the job answered, and the next question, asked right away,
waited for the cores: a warm re-run took 10-12 % of the cold job's time instead of 5 %.

So a job's deferred indexing is one task that takes its pages in turn, one such task at
a time per worker process (`turn`), and before each page it waits until this worker has
had nothing else to do for `QUIET_S`: no task running that is neither deferred nor
housekeeping, no message waiting in the interactive (priority 0) list of a queue it
consumes. A task that
has waited `BUDGET_S` hands its remaining pages to a new message (the pages done are
skipped) rather than run into its time limit.

Other processes' work is not seen: with a prefork pool each child sees only its own
task, and workers of other processes keep their own cores.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

logger = logging.getLogger("webctx.worker")

DEFERRED = frozenset({"webctx.index_later"})
HOUSEKEEPING = frozenset({"webctx.index.tick", "webctx.admission_tick"})
"""Tasks that run on the worker's own schedule (beat's ticks): no one waits for them, and
they keep neither deferred work waiting nor the local service from idling out."""
POLL_S = 0.05
BUDGET_S = 300.0
"""A deferred task's whole wait, well within the task time limit (600 s)."""
QUIET_S = 1.0
"""Deferred work starts, or goes on, once nothing urgent has run for this long: the gaps
between one job's tasks, and a client reading its answer and asking the next question,
are shorter."""
RESEND_S = 5.0
"""A deferred task that ran out of budget comes back after this long."""

_turn = threading.Lock()


def others_running() -> bool:
    """True while this worker runs a task that is neither deferred nor housekeeping."""
    from celery.worker import state

    return any(r.name not in DEFERRED | HOUSEKEEPING for r in list(state.active_requests))


def interactive_waiting() -> bool:
    """True while a message waits in the priority 0 list of a queue this worker consumes
    (interactive jobs' tasks; batch items and deferred work are lower). Read where the
    queues are lists of the state Redis (the local service's Valkey, a Redis broker that
    is also the job store); elsewhere only running tasks are seen."""
    from webctx.workers.app import app, worker_deps

    deps = worker_deps()
    settings = deps.settings
    if not settings.embedded and settings.state_url() != settings.broker_url:
        return False
    queues = list(app.amqp.queues.consume_from) or [q.name for q in app.conf.task_queues]
    try:
        return deps.stores.queued(queues) > 0
    except Exception:  # noqa: BLE001 - a broker hiccup: the running-task check still holds
        logger.debug("queue lengths unreadable", exc_info=True)
        return False


def busy() -> bool:
    """True while this worker has more urgent work than deferred work."""
    return others_running() or interactive_waiting()


@contextmanager
def turn(
    *, budget_s: float = BUDGET_S, quiet_s: float = QUIET_S, urgent: Callable[[], bool] = busy
) -> Iterator[Callable[[], bool]]:
    """This process's one turn at deferred work (waited for), and the `pause` to call
    before each unit of it: it returns True once nothing has been `urgent` for `quiet_s`
    (counted from the turn's start: the job that sent it has only just answered), or
    False once the turn has lasted `budget_s` (the caller hands the rest over)."""
    started = time.monotonic()
    got = _turn.acquire(timeout=budget_s)
    last_urgent = [started]

    def pause() -> bool:
        if not got:
            return False
        paused: float | None = None
        while True:
            now = time.monotonic()
            if urgent():
                last_urgent[0] = now
                if paused is None:
                    paused = now
                    logger.info("deferred work paused for interactive work")
            elif now - last_urgent[0] >= quiet_s:
                break
            if now - started > budget_s:
                return False
            time.sleep(POLL_S)
        if paused is not None:
            logger.info("deferred work resumed",
                        extra={"waited_s": round(time.monotonic() - paused, 2)})  # fmt: skip
        return True

    try:
        yield pause
    finally:
        if got:
            _turn.release()
