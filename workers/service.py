"""The local service (`webctx service run`): one per data directory, started by the first
local client that finds none (webctx/workers/service_client.py).

It owns what admits one process or should be shared: the embedded Valkey (the job store,
the caches, the index's records, and the Celery broker), the embedded vector store, and
the worker pool, which is `webctx worker` itself (a thread pool consuming every queue from
the Valkey socket, whose stop hands long tasks back: webctx/workers/handback.py) plus
Celery beat's schedule (the index's re-index ticks) in a thread.
It exits after `WEBCTX_SERVICE_IDLE_S` with no task running, no message queued and no
client request (clients touch its address file at every request).

Started twice for one data directory, the second finds the lock held and exits 0. Its
Valkey lives as long as it does, however it ends (webctx/workers/state_server.py). Killed
(even by SIGKILL), it leaves its lock free, and the next client starts a new one, which
starts Valkey again from its append-only file, reopens the vector store, and requeues the
dead one's unacked tasks before it consumes.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from webctx.settings import Settings
from webctx.workers.deferred import HOUSEKEEPING
from webctx.workers.service_client import (
    ADDRESS_FILE,
    LOCK_FILE,
    mark_service_process,
    settings_fingerprint,
)
from webctx.workers.service_settings import service_record

logger = logging.getLogger("webctx.service")

Inbox = tuple[str, Callable[[str, threading.Event], None]]
"""A list on the service's Valkey that clients hand requests to, and the function that
serves it (on the socket, until the event is set) in a thread (webctx/api/inbox.py)."""


def run_service(settings: Settings, *, inbox: Inbox | None = None) -> int:
    """Serve until idle or stopped; the exit code (0 also when another service runs)."""
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        logger.info("a service already runs for this data directory", extra={"dir": str(data_dir)})
        return 0
    os.ftruncate(lock, 0)
    os.pwrite(lock, str(os.getpid()).encode(), 0)
    address = data_dir / ADDRESS_FILE
    address.unlink(missing_ok=True)  # a dead service's, if any
    mark_service_process()
    from webctx.workers.state_server import state_server_url

    socket = state_server_url(data_dir).removeprefix("unix://").split("?")[0]
    temp = address.with_suffix(".tmp")
    fingerprint = settings_fingerprint(dict(os.environ))
    stop = threading.Event()
    if inbox is not None:
        # Before the address is written: a client that reads it finds the inbox served.
        threading.Thread(target=inbox[1], args=(socket, stop), daemon=True,
                         name="service-inbox").start()  # fmt: skip
    temp.write_text(json.dumps({"pid": os.getpid(), "socket": socket, "started": time.time(),
                                "settings": fingerprint, **service_record(settings),
                                "inbox": inbox[0] if inbox else None}))  # fmt: skip
    temp.replace(address)  # clients see a whole file or none
    logger.info("service listening", extra={"socket": socket, "pid": os.getpid()})
    try:
        return _run_worker(settings, address)
    finally:
        stop.set()
        if _owns(address):
            address.unlink(missing_ok=True)


def _owns(address: Path) -> bool:
    try:
        return int(json.loads(address.read_text())["pid"]) == os.getpid()
    except (OSError, ValueError, KeyError):
        return False


def _run_worker(settings: Settings, address: Path) -> int:
    """`webctx worker` on every queue, in this process, with beat and the idle clock."""
    from celery import signals
    from celery.bin.celery import celery as celery_cli

    from webctx.workers.app import app
    from webctx.workers.handback import requeue_dead_services

    requeue_dead_services(app)  # before it consumes: what a killed service held, at once
    app.conf.worker_pool = SERVICE_POOL  # with no --pool, Celery takes the configured one
    hostname = f"service-{os.getpid()}@webctx"
    idle = IdleClock(address, idle_s=settings.service_idle_s)
    beat: list[Any] = []

    def started(**_: Any) -> None:
        from celery.beat import EmbeddedService

        service = EmbeddedService(app, thread=True, scheduler_cls="celery.beat:Scheduler")
        service.start()
        beat.append(service)
        if settings.service_idle_s > 0:
            threading.Thread(target=idle.watch, args=(_queued,), daemon=True,
                             name="service-idle").start()  # fmt: skip

    def stopping(**_: Any) -> None:
        # Not `service.stop()`, which waits for beat's thread for good: with the broker
        # gone that thread retries its connection forever, and the service never exited.
        for service in beat:
            service.service.stop(wait=False)
            service.join(timeout=BEAT_STOP_S)

    signals.worker_ready.connect(started, weak=False)
    signals.worker_shutdown.connect(stopping, weak=False)
    signals.task_prerun.connect(idle.busy, weak=False)
    signals.task_postrun.connect(idle.busy, weak=False)
    args = ["worker", "--concurrency", str(settings.worker_concurrency),
            "--hostname", hostname, "--without-mingle", "--without-gossip",
            "--loglevel", settings.log_level]  # fmt: skip
    celery_cli.params[0].default = app
    code = celery_cli.main(args=args, standalone_mode=False)
    return int(code or 0)


def _queued() -> int:
    """Messages waiting in the service's queues (every priority list of each)."""
    from webctx.workers.app import worker_deps
    from webctx.workers.celeryconfig import queue_lists

    return worker_deps().stores.queued(queue_lists())


SERVICE_POOL = "webctx.workers.handback:ServicePool"
"""A thread pool whose stop hands long tasks back instead of waiting for them."""


def exit_now(code: int) -> NoReturn:
    """Leave once the worker has stopped, without waiting for the threads of tasks handed
    back (a download may go on for a minute; the interpreter's exit would join them):
    close the collaborators (the vector store, the extraction processes), run the exit
    handlers (Valkey's shutdown among them), flush the output."""
    from webctx.workers.app import has_deps, worker_deps

    if has_deps():
        try:
            worker_deps().close()
        except Exception:  # a stop must not fail on what it closes
            logger.warning("service: collaborators not closed", exc_info=True)
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


BEAT_STOP_S = 5.0
"""How long a stopping service waits for beat to save its schedule (its thread is a daemon)."""



class IdleClock:
    """When the service last had work or a request, and the exit once it has been idle."""

    def __init__(self, address: Path, *, idle_s: float) -> None:
        self.address = address
        self.idle_s = idle_s
        self._last_busy = time.time()

    def busy(self, sender: Any = None, **_: Any) -> None:
        """A task started or ended (beat's own tick is not work: it runs every
        `WEBCTX_INDEX__TICK_S`, and counted it kept the service up for good; a source it
        finds due starts refresh tasks, and those are)."""
        if getattr(sender, "name", None) in HOUSEKEEPING:
            return
        self._last_busy = time.time()

    def last_activity(self) -> float:
        """The latest of: a task's start or end, a client's request."""
        try:
            touched = self.address.stat().st_mtime
        except OSError:
            touched = 0.0
        return max(self._last_busy, touched)

    def watch(self, queued: Callable[[], int]) -> None:
        """Stop the worker (as SIGTERM does) once idle for `idle_s`."""
        from celery.worker import state

        interval = max(0.2, min(5.0, self.idle_s / 5))
        while True:
            time.sleep(interval)
            if any(r.name not in HOUSEKEEPING for r in state.active_requests):
                self.busy()
                continue
            if time.time() - self.last_activity() < self.idle_s:
                continue
            try:
                waiting = queued()
            except Exception:  # Valkey gone: nothing to serve
                logger.warning("service: queue lengths unreadable", exc_info=True)
                waiting = 0
            if waiting:
                self.busy()
                continue
            logger.info("service idle: exiting", extra={"idle_s": self.idle_s})
            os.kill(os.getpid(), signal.SIGTERM)
            return
