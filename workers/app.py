"""The Celery application (`celery -A webctx.workers.app worker`), and the assembly of a
worker process: its collaborators (`worker_deps`, built once), what its job store tells
(`job_observers`), and what it does at start (open the vector store, load the tokenizer).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery import Celery, group, signals

from webctx import tokens
from webctx.allocator import return_freed_memory
from webctx.errors import ConfigError, NeedsRender, WebctxError
from webctx.jobs.batches import FeedOnItemEnd
from webctx.jobs.store import JobObserver
from webctx.settings import get_settings
from webctx.workers.celeryconfig import REINDEX_QUEUE
from webctx.workers.deps import Deps, build_deps
from webctx.workers.liveness import Heartbeat
from webctx.workers.metrics import MetricsObserver, install_worker_signals
from webctx.workers.policy import StageTask

# No fixups: Celery's one built-in (Django's) imports the whole worker package into every
# client that only sends tasks.
app = Celery(
    "webctx",
    task_cls=StageTask,
    include=["webctx.workers.tasks", "webctx.workers.index_tasks"],
    fixups=[],
)
app.config_from_object("webctx.workers.celeryconfig")
install_worker_signals(app)  # stage metrics, job_id/task_id on log lines, optional tracing

logger = logging.getLogger("webctx.worker")


def start_tasks(stage: str, arguments: Sequence[tuple[str | int, ...]]) -> None:
    """Send one `webctx.<stage>` task per argument tuple (a group when there are several):
    how the job engine's fan-in starts a stage."""
    signatures = [app.signature(f"webctx.{stage}", args=args) for args in arguments]
    if len(signatures) == 1:
        signatures[0].apply_async()
    elif signatures:
        group(signatures).apply_async()


def publish_held(job_id: str) -> None:
    """Send a held job's plan task at the front (webctx.jobs.admission moved it into a slot);
    its watchdog was sent at its submission."""
    app.signature("webctx.plan", args=(job_id,)).apply_async(priority=broker_priority(None))


def _feed_soon(batch_id: str) -> None:
    """Send the batch's feeder now, ahead of the items' own tasks (priority 0)."""
    app.signature("webctx.batch_feed", args=(batch_id,)).apply_async(priority=broker_priority(0))


def job_observers() -> list[JobObserver]:
    """What the job store of a worker or API process tells of each fact it records: the
    metrics, and the batch feeder when a batch item's job ends."""
    return [MetricsObserver(), FeedOnItemEnd(_feed_soon)]


_deps_lock = threading.Lock()
_deps: Deps | None = None


def worker_deps() -> Deps:
    """This process's collaborators, built on first use (thread-safe)."""
    global _deps
    with _deps_lock:
        if _deps is None:
            _deps = build_deps(get_settings(), start=start_tasks, observers=job_observers(),
                               publish=publish_held)  # fmt: skip
        return _deps


def has_deps() -> bool:
    """True in a process whose collaborators are built (a worker, the local service)."""
    with _deps_lock:
        return _deps is not None


def set_deps(deps: Deps | None) -> None:
    """Install (or clear) this process's collaborators: the embedded runner shares its own."""
    global _deps
    with _deps_lock:
        _deps = deps


TOKEN_QUEUES = frozenset({"embed", "store", "rank", REINDEX_QUEUE})
"""Queues whose tasks count tokens: chunking, embedding (the question too), re-indexing."""


def load_tokenizer(queues: set[str]) -> bool:
    """Load the tokenizer now when a worker consuming `queues` will count tokens.

    Its tables (about 35 MB) are a fixed cost: loaded at start, a worker's memory is as
    large after its first minute as after its ten-thousandth task, so it can be sized
    (and its growth watched) from the start, and no task waits for the load."""
    if not queues & TOKEN_QUEUES:
        return False
    tokens.encoding()
    logger.info("tokenizer loaded", extra={"encoding": tokens.ENCODING_NAME})
    return True


STORE_QUEUES = frozenset({"store", "rank", REINDEX_QUEUE})
"""Queues whose tasks open the vector store."""


def store_refusal(queues: set[str], pool: type) -> str | None:
    """Why this worker cannot serve the queues that need the vector store, or None.

    The embedded engine admits one process per path. A second worker started in the same
    folder would take store and rank tasks it can only fail, so it finds out now, at start,
    by opening the store (which it must do before its first task anyway: `Deps.store`).
    A prefork pool cannot share one opened engine between its children."""
    if not queues & STORE_QUEUES:
        return None
    deps = worker_deps()
    if deps.settings.qdrant_url:
        if "prefork" not in pool.__module__:  # each prefork child opens its own client
            _open_store_early(deps)
        return None
    if "prefork" in pool.__module__:
        return (
            "the embedded vector store admits one process, and a prefork pool has several: "
            "use --pool threads (the default of `webctx worker`)"
        )
    try:
        deps.open_store()
    except ConfigError as exc:
        return str(exc)
    logger.info("vector store opened", extra={"path": str(deps.settings.qdrant_path)})
    return None


def _open_store_early(deps: Deps) -> None:
    """Open a server-backed store before the first task; its tasks report a failure."""
    try:
        deps.open_store()
    except WebctxError as exc:
        logger.error("vector store not opened", extra={"exc": str(exc)})


def leave_store_queues(instance: Any, queues: set[str], why: str) -> None:
    """Stop this worker from consuming the vector-store queues, saying so in one line; exit
    when nothing is left for it to consume."""
    dropped = sorted(queues & STORE_QUEUES)
    remaining = sorted(queues - STORE_QUEUES)
    if not remaining:
        logger.critical("cannot serve %s: %s", ", ".join(dropped), why)
        raise SystemExit(1)
    instance.app.amqp.queues.deselect(dropped)
    logger.warning(
        "not consuming %s (%s); serving %s, and taking over the store if it is released. "
        "Several store/rank workers need a Qdrant server: set WEBCTX_QDRANT_URL",
        ", ".join(dropped), why, ", ".join(remaining),
    )  # fmt: skip
    if "prefork" not in instance.pool_cls.__module__:
        _standby.update(hostname=instance.hostname, queues=dropped)


def refuse_beside_the_service(queues: set[str]) -> None:
    """Exit, in one line, when the vector store this broker worker cannot open is held by
    the local service of its data directory: the service serves its own Valkey's jobs
    only, so this worker's store and rank tasks would wait for it for good (a job whose
    worker was killed and started again never ended)."""
    from webctx.adapters.edge_store import store_holder
    from webctx.workers.service_client import service_holder

    settings = worker_deps().settings
    if settings.embedded or settings.qdrant_url:
        return
    holder = store_holder(settings.qdrant_path)
    if holder is None or not holder.isdigit():
        return
    pid = int(holder)
    if pid != service_holder(settings.data_dir) and not _is_service(pid):
        return  # another broker worker: wait to take the store over
    logger.critical(
        "cannot serve %s: the vector store %s is held by the local service (pid %s); stop it "
        "(`webctx service stop`), or give this worker its own WEBCTX_DATA_DIR, or use a Qdrant "
        "server (WEBCTX_QDRANT_URL)",
        ", ".join(sorted(queues & STORE_QUEUES)), settings.qdrant_path, pid,
    )  # fmt: skip
    raise SystemExit(1)


def _is_service(pid: int) -> bool:
    """True when `pid` is a `webctx service run` (whatever its data directory)."""
    try:
        return b"service\x00run" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


RENDER_QUEUE = "render"


def leave_render_queue(instance: Any, queues: set[str]) -> set[str]:
    """The queues left to consume once `render` is dropped where this process cannot render
    (no browser, or rendering off), said in one line; exit when nothing is left."""
    if RENDER_QUEUE not in queues or worker_deps().engine.renderer is not None:
        return queues
    settings = worker_deps().settings
    why = NeedsRender.INSTALL_HINT if settings.render.enabled else "WEBCTX_RENDER__ENABLED=false"
    remaining = queues - {RENDER_QUEUE}
    if not remaining:
        logger.critical("cannot serve render: %s", why)
        raise SystemExit(1)
    instance.app.amqp.queues.deselect([RENDER_QUEUE])
    logger.warning("not consuming render: no browser here (%s)", why)
    return remaining


_standby: dict[str, Any] = {}
"""The store queues this worker left at start, to take over once the store is released."""
STANDBY_POLL_S = 5.0


@signals.worker_ready.connect(weak=False)
def _start_standby(**_: Any) -> None:
    """Once consuming, watch the store's lock: when its holder stops (a closed terminal, a
    crash), this worker opens the store and starts consuming its queues, so jobs go on."""
    if _standby:
        threading.Thread(target=_take_over_store, name="store-standby", daemon=True).start()


def _take_over_store() -> None:
    hostname, queues = _standby["hostname"], _standby["queues"]
    while True:
        time.sleep(STANDBY_POLL_S)
        try:
            worker_deps().open_store()
        except ConfigError:
            continue  # still held by another worker
        except WebctxError as exc:
            logger.error("vector store not opened", extra={"exc": str(exc)})
            continue
        load_tokenizer(set(queues))
        for queue in queues:  # runs in the consumer's thread, as `celery control` would
            app.control.add_consumer(queue, destination=[hostname], reply=False)
        logger.warning("vector store opened after its holder stopped: consuming %s",
                       ", ".join(queues))  # fmt: skip
        return


@signals.celeryd_after_setup.connect(weak=False)
def _prepare(instance: Any = None, **_: Any) -> None:
    """Main worker process, once -Q applies and logging is set up, before the pool starts
    (forked children share the tokenizer's tables)."""
    if instance is None:
        return
    applied = return_freed_memory()  # before the pool's threads or children exist
    settings = ", ".join(f"{name}={value}" for name, value in applied.items()) or "none"
    logger.info("allocator set to return freed memory: %s", settings)
    queues = leave_render_queue(instance, set(instance.app.amqp.queues.consume_from))
    why = store_refusal(queues, instance.pool_cls)
    if why is not None:
        refuse_beside_the_service(queues)
        leave_store_queues(instance, queues, why)
        queues -= STORE_QUEUES
    load_tokenizer(queues)
    _heartbeat.extend(make_heartbeat())
    _warm_on_ready[:] = [warms_embedder(queues, instance.pool_cls)]


_heartbeat: list[Heartbeat] = []
EMBEDDER_QUEUES = frozenset({"embed", "rank", REINDEX_QUEUE})
"""Queues whose tasks embed (pages, the question, re-indexed pages)."""
_warm_on_ready: list[bool] = []


def warms_embedder(queues: set[str], pool_cls: type) -> bool:
    """Whether this process builds its embedder once consuming: when it takes embedding
    queues and runs their tasks itself (a thread or solo pool). A prefork parent runs no
    task, and a child forked after it loaded an in-process model (ONNX Runtime's or
    OpenVINO's thread pools) would inherit the model without its threads."""
    return bool(queues & EMBEDDER_QUEUES) and "prefork" not in pool_cls.__module__


@signals.worker_ready.connect(weak=False)
def _warm_embedder(**_: Any) -> None:
    """Once consuming, build the embedder's client in the background (the OpenAI client
    costs ~0.5 s of CPU to import): at start it would delay the job's first tasks, which
    need none, and the first embed then finds it built. Then what the worker loaded is
    left out of the collector's full collections (`freeze_loaded`)."""
    if _warm_on_ready and _warm_on_ready[0]:
        threading.Thread(target=_warm_then_freeze, name="embedder-warm", daemon=True).start()
    else:
        _start_extraction()
        freeze_loaded()


def _warm_then_freeze() -> None:
    warm_embedder()
    _start_extraction()
    freeze_loaded()


def _start_extraction() -> None:
    """Start the extraction's child processes, where there are some (the local service:
    webctx/adapters/extract_children.py); pages are extracted in their tasks' threads
    until one is ready."""
    start = getattr(worker_deps().engine.html, "start", None)
    if callable(start):
        start()


def freeze_loaded() -> None:
    """Move every object alive now (the modules, clients and tables the worker loaded,
    ~180k objects on the local service) out of the collector's reach: a full collection
    walked them all, 50-60 ms in the middle of a job (its rank, measured), and now walks
    only what the tasks made since. They live as long as the process; what loading left
    unreachable stays, rather than a collection of ~70 ms now, maybe in a job's path."""
    gc.freeze()
    logger.info("loaded objects left out of full collections", extra={
        "frozen": gc.get_freeze_count()})  # fmt: skip


def warm_embedder() -> None:
    """Build this process's embedder client now, if it builds one lazily."""
    warm = getattr(worker_deps().engine.embedder, "warm", None)
    if callable(warm):
        try:
            warm()
        except Exception:  # the first embed will say what is wrong
            logger.warning("embedder not warmed", exc_info=True)


def make_heartbeat() -> list[Heartbeat]:
    """On a Redis broker, this worker's heartbeat (webctx/workers/liveness.py), recording
    from now on, before the worker consumes, so every message it takes is in its held set."""
    lost_after = get_settings().worker_lost_after_s
    if not str(app.conf.broker_url).startswith(("redis://", "webctx+socket://")) or lost_after <= 0:
        return []
    heartbeat = Heartbeat(app.connection_for_write, lost_after_s=lost_after)
    heartbeat.record()
    return [heartbeat]


@signals.worker_ready.connect(weak=False)
def _start_heartbeat(**_: Any) -> None:
    for heartbeat in _heartbeat:
        heartbeat.start()


@signals.worker_shutdown.connect(weak=False)
def _stop_heartbeat(**_: Any) -> None:
    while _heartbeat:
        _heartbeat.pop().stop()


@signals.worker_shutdown.connect(weak=False)
@signals.worker_process_shutdown.connect(weak=False)
def _flush_writes(**_: Any) -> None:
    """A worker (or a prefork child) stopping makes the store's pending writes durable and
    marks their pages stored (webctx/jobs/group_flush.py); a killed one leaves them to be
    stored again."""
    if has_deps():
        worker_deps().engine.flush_writes()


def broker_priority(priority: int | None) -> int | None:
    """The broker's priority for a webctx priority: 0 (served first, interactive jobs'
    default) to 9 (batch items), as on Redis; AMQP serves the highest number first."""
    if not str(app.conf.broker_url).startswith(("amqp://", "amqps://", "pyamqp://")):
        return priority
    return 9 - (priority or 0)
