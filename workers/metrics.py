"""Prometheus metrics, JSON-log correlation and optional tracing for workers and the API.

Where each number comes from:

- the job store (a `MetricsObserver` among its observers, attached by the worker's app
  and the API): jobs by status, pages fetched, failures by stage and reason, chunks,
  embedding requests, tokens embedded, cache hits;
- Celery signals: duration of each task by stage (histogram), task outcomes, retries;
- log events: 429s met inside a task (`embed request retried` with RateLimited, `host
  paused` with status 429) — the stages already log them, so no stage knows of metrics;
- scrape time (API only): messages waiting in each queue (the stages and reindex), asked of
  the broker.

A worker serves its metrics on `WEBCTX_METRICS_PORT`. Prefork children cannot share the
main process's registry: with `PROMETHEUS_MULTIPROC_DIR` set (before the worker starts)
each child writes its counters to files there and the main process serves their sum.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from itertools import product
from pathlib import Path
from typing import Any, get_args

from celery import Celery, signals
from kombu.exceptions import ChannelError
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.responses import Response
from starlette.routing import Route

from webctx import errors
from webctx.errors import RateLimited
from webctx.logging import bind_context, clear_context, configure_logging
from webctx.models import Failure, JobStatus
from webctx.search_settings import PROVIDERS
from webctx.settings import get_settings

logger = logging.getLogger(__name__)

JOBS = Counter("webctx_jobs", "Jobs that entered each status.", ["status"])
STAGE_SECONDS = Histogram(
    "webctx_stage_duration_seconds",
    "Duration of one task, by stage (plan, search, fetch, embed = chunk+embed, store, rank).",
    ["stage"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600),
)
TASKS = Counter(
    "webctx_tasks",
    "Tasks finished, by stage, the queue they came from, and Celery state.",
    ["stage", "queue", "state"],
)
PAGES_FETCHED = Counter("webctx_pages_fetched", "Pages fetched and extracted.")
FAILURES = Counter(
    "webctx_source_failures",
    "Sources (or queries) that failed, by stage and reason.",
    ["stage", "reason"],
)
TOKENS_EMBEDDED = Counter("webctx_tokens_embedded", "Tokens sent to the embeddings API.")
EMBED_REQUESTS = Counter("webctx_embed_requests", "Requests sent to the embeddings API.")
CHUNKS = Counter("webctx_chunks", "Chunks stored in the vector store.")
CACHE_HITS = Counter("webctx_embed_cache_hits", "Chunks whose vector came from the cache.")
RATE_LIMITED = Counter(
    "webctx_rate_limited", "429 answers met, by peer (embeddings, search, site).", ["peer"]
)
RATE_LIMITED_PEERS = ("embeddings", "search", "site")
SEARCH_REQUESTS = Counter(
    "webctx_search_requests",
    "Search requests by provider and outcome: answered, failed (an error, a 429, no answer: the"
    " chain hands the query on), skipped (its breaker was open: nothing sent).",
    ["provider", "outcome"],
)
SEARCH_OUTCOMES = ("answered", "failed", "skipped")
_COUNTS = {
    "tokens_embedded": TOKENS_EMBEDDED,
    "embed_requests": EMBED_REQUESTS,
    "chunks": CHUNKS,
    "cache_hits": CACHE_HITS,
}


def _error_reasons(cls: type[errors.WebctxError]) -> Iterator[str]:
    reason = vars(cls).get("reason")
    if isinstance(reason, str):
        yield reason
    yield from vars(cls).get("reasons", ())  # a class whose instances carry one of several
    for sub in cls.__subclasses__():
        yield from _error_reasons(sub)


# Every reason a Failure is recorded with, bar the class names of unexpected exceptions
# (webctx.jobs.steps.record_failure): the error tree's `reason`s, Failure's default, a
# chunk whose page is gone (stages/bundle.py), a worker that died on the item (jobs/pages.py).
FAILURE_REASONS = tuple(
    dict.fromkeys(
        [*_error_reasons(errors.WebctxError), "error", "missing_page", "worker_lost", "not_cached"]
    )  # fmt: skip
)
FAILURE_STAGES: tuple[str, ...] = get_args(Failure.model_fields["stage"].annotation)


def init_series() -> None:
    """Create every known labelled series at zero. A labelled counter has no series until
    its first `inc`, so "failures / (failures + pages)" would be "No data" on a healthy
    system, and `rate(...) > x` could not tell "none" from "not scraped"."""
    for stage, reason in product(FAILURE_STAGES, FAILURE_REASONS):
        FAILURES.labels(stage=stage, reason=reason)
    for status in JobStatus:
        JOBS.labels(status=status.value)
    for peer in RATE_LIMITED_PEERS:
        RATE_LIMITED.labels(peer=peer)
    for provider, outcome in product(PROVIDERS, SEARCH_OUTCOMES):
        SEARCH_REQUESTS.labels(provider=provider, outcome=outcome)


# At import, where the metrics are defined: a prefork child inherits the series and writes
# them to its own file (PROMETHEUS_MULTIPROC_DIR) at its first metric update.
init_series()


class MetricsObserver:
    """Turns the facts the job store records into counters (a JobObserver)."""

    def job_event(self, event: str, job_id: str, facts: Mapping[str, Any]) -> None:  # noqa: ARG002
        """Count one recorded fact."""
        if event == "status":
            JOBS.labels(status=str(facts["status"])).inc()
        elif event == "page":
            PAGES_FETCHED.inc()
        elif event == "failure":
            FAILURES.labels(stage=str(facts["stage"]), reason=str(facts["reason"])).inc()
        elif event == "counts":
            for name, delta in facts.items():
                if name in _COUNTS and int(delta) > 0:
                    _COUNTS[name].inc(int(delta))
                elif name.startswith("search_") and ":" in name and int(delta) > 0:
                    outcome, provider = name.removeprefix("search_").split(":", 1)
                    if outcome in SEARCH_OUTCOMES:
                        SEARCH_REQUESTS.labels(provider=provider, outcome=outcome).inc(int(delta))


class RateLimitLogCounter(logging.Handler):
    """Counts the 429s the stages log; formats and prints nothing."""

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if msg == "embed request retried" and str(getattr(record, "exc", "")).startswith(
            "RateLimited"
        ):
            RATE_LIMITED.labels(peer="embeddings").inc()
        elif msg == "host paused" and getattr(record, "status", None) == 429:
            RATE_LIMITED.labels(peer="site").inc()


# -- Celery signals ---------------------------------------------------------------------------
_started: dict[str, float] = {}


def _stage(task: Any) -> str:
    return str(getattr(task, "name", "") or "unknown").removeprefix("webctx.")


def _on_prerun(task_id: str, args: Iterable[Any] | None = None, **_: Any) -> None:
    _started[task_id] = time.perf_counter()
    first = next(iter(args or ()), None)
    bind_context(job_id=first if isinstance(first, str) else None, task_id=task_id)


def _queue(task: Any) -> str:
    """The queue the task was taken from: each queue's routing key is its name (celeryconfig)."""
    info = getattr(getattr(task, "request", None), "delivery_info", None) or {}
    queue = info.get("routing_key")
    if not queue and getattr(task, "app", None) is not None:
        queue = task.app.amqp.router.route({}, task.name)["queue"].name
    return str(queue or "unknown")


def _on_postrun(task_id: str, task: Any, state: str | None = None, **_: Any) -> None:
    began = _started.pop(task_id, None)
    stage = _stage(task)
    if began is not None:
        STAGE_SECONDS.labels(stage=stage).observe(time.perf_counter() - began)
    state_label = (state or "UNKNOWN").lower()
    TASKS.labels(stage=stage, queue=_queue(task), state=state_label).inc()
    clear_context()


def _on_retry(sender: Any = None, reason: Any = None, **_: Any) -> None:
    if isinstance(reason, RateLimited):
        stage = _stage(sender)
        RATE_LIMITED.labels(peer="search" if stage == "search" else "embeddings").inc()


def _on_worker_init(**_: Any) -> None:
    """Main worker process, before the pool forks: open the metrics port, count 429s."""
    settings = get_settings()
    if settings.metrics_port is None:
        return
    # On the `webctx` logger, not root: Celery leaves a root that has a handler unconfigured.
    logging.getLogger("webctx").addHandler(RateLimitLogCounter())
    registry: CollectorRegistry = REGISTRY
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)  # a fresh tmpfs/emptyDir at /tmp
        for stale in Path(path).glob("*.db"):  # the previous run's children
            stale.unlink()
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=path)
    try:
        start_http_server(settings.metrics_port, addr=settings.metrics_host, registry=registry)
    except OSError as exc:  # metrics are not worth a worker: say so and go on
        logger.error(
            "metrics port unavailable", extra={"port": settings.metrics_port, "exc": str(exc)}
        )
        return
    logger.info("metrics served", extra={"port": settings.metrics_port, "multiprocess": bool(path)})


def _on_child_exit(pid: int | None = None, **_: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and pid:
        multiprocess.mark_process_dead(pid)


def _json_logging(loglevel: Any = None, **_: Any) -> None:
    settings = get_settings()
    configure_logging(json=True, level=loglevel or settings.log_level)


def _trace_worker(**_: Any) -> None:
    install_tracing(celery=True)


def install_worker_signals(app: Celery) -> None:
    """Connect the handlers above to `app`'s signals (workers/app.py calls this once)."""
    del app  # Celery's signals are global; the argument says which app asked
    signals.task_prerun.connect(_on_prerun, weak=False)
    signals.task_postrun.connect(_on_postrun, weak=False)
    signals.task_retry.connect(_on_retry, weak=False)
    signals.worker_init.connect(_on_worker_init, weak=False)
    signals.worker_process_shutdown.connect(_on_child_exit, weak=False)
    settings = get_settings()
    if settings.log_format == "json":
        # Any receiver of setup_logging replaces Celery's own log set-up: connect only then.
        signals.setup_logging.connect(_json_logging, weak=False)
    if settings.otel:
        # Before the pool forks: the SDK's span processor restarts its thread in each child.
        signals.worker_init.connect(_trace_worker, weak=False)


# -- queue depths and the API's /metrics ------------------------------------------------------
class QueueDepthCollector(Collector):
    """Messages waiting in each queue, asked of the broker at scrape time."""

    def __init__(self, app: Celery, queues: Iterable[str]) -> None:
        self.app = app
        self.queues = tuple(queues)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One gauge per queue (absent queues count 0), and whether the broker answered."""
        depth = GaugeMetricFamily(
            "webctx_queue_depth", "Messages waiting in a queue.", labels=["queue"]
        )
        up = 1.0
        try:
            for queue, count in self._depths():
                depth.add_metric([queue], count)
        except Exception as exc:  # a scrape reports the broker down, it does not fail
            logger.warning("queue depth unavailable", extra={"exc": repr(exc)[:200]})
            up = 0.0
        yield depth
        yield GaugeMetricFamily("webctx_broker_up", "1 if the broker answered the scrape.", up)

    def _depths(self) -> Iterator[tuple[str, float]]:
        with self.app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            for queue in self.queues:
                # A channel per queue: AMQP closes the channel that asked for a missing queue.
                channel = conn.channel()
                try:
                    _, count, _ = channel.queue_declare(queue=queue, passive=True)
                except (ChannelError, *conn.channel_errors):
                    count = 0  # never declared yet, or (Redis) empty
                finally:
                    try:
                        channel.close()
                    except Exception:
                        pass
                yield queue, float(count)


class MetricsEndpoint:
    """GET /metrics: this process's metrics (or its prefork siblings'), plus queue depths."""

    def __init__(self, *, queue_depths: Collector | None = None) -> None:
        self.base: CollectorRegistry = REGISTRY
        path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if path:  # e.g. the API under gunicorn with several uvicorn workers
            self.base = CollectorRegistry()
            multiprocess.MultiProcessCollector(self.base, path=path)
        self.extra = CollectorRegistry(auto_describe=False)
        if queue_depths is not None:
            self.extra.register(queue_depths)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import anyio.to_thread

        body = await anyio.to_thread.run_sync(self.render)
        await Response(body, media_type=CONTENT_TYPE_LATEST)(scope, receive, send)

    def render(self) -> bytes:
        """The exposition text (blocking: it may ask the broker)."""
        return generate_latest(self.base) + generate_latest(self.extra)


def observe_api(fastapi_app: Any, celery_app: Celery) -> None:
    """Give the API app `/metrics` (with the queue depths `celery_app`'s broker reports)
    and, with WEBCTX_OTEL, traces."""
    queues = [queue.name for queue in celery_app.conf.task_queues]  # stages and reindex
    endpoint = MetricsEndpoint(queue_depths=QueueDepthCollector(celery_app, queues))
    fastapi_app.router.routes.append(Route("/metrics", endpoint=endpoint, methods=["GET"]))
    if get_settings().otel:
        install_tracing(celery=False)
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(fastapi_app)


# -- tracing (optional extra) -----------------------------------------------------------------
_traced = False


def install_tracing(*, celery: bool) -> None:
    """Export spans over OTLP (OTEL_* env) and instrument Celery and httpx; once per process.

    Celery's instrumentation propagates the trace context in task headers, so the spans of
    plan, search, fetch, embed and rank of one job share the submitting request's trace.
    """
    global _traced
    if _traced:
        return
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        logger.error("tracing unavailable: pip install 'webctx[otel]'", extra={"exc": str(exc)})
        return
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    HTTPXClientInstrumentor().instrument()
    if celery:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()
    _traced = True
