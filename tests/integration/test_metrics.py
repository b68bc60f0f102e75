"""Prometheus metrics after real jobs: the API's /metrics (jobs, queue depths) and the
workers' metrics ports (threads pool, and prefork through PROMETHEUS_MULTIPROC_DIR)."""

from __future__ import annotations

import collections
import gzip
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import clean_env, redis_url, run_cli
from tests.integration.conftest import ApiProcess, free_port
from tests.testweb import LoopbackWeb
from webctx.devweb.server import LoopbackServer
from webctx.models import Bundle
from webctx.tokens import count_tokens

QUESTION = "how do lithium-ion batteries degrade?"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of a /metrics page, keyed by name and labels."""
    resp = httpx.get(url, timeout=10)
    assert resp.status_code == 200, resp.text[:500]
    assert resp.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when absent: counters appear on first increment)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: list[Samples], name: str, **labels: str) -> float:
    """A sample summed over processes, as Prometheus would with sum()."""
    return sum(value(s, name, **labels) for s in samples)


def test_api_metrics_count_the_submitted_job_and_its_queued_messages(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(
        **test_web.env(),
        CELERY_BROKER_URL=redis_url(),
        WEBCTX_QDRANT_PATH=str(tmp_path / "q"),
        WEBCTX_API_AUTH="disabled",
    )
    api = ApiProcess(env, tmp_path / "api.log")
    try:
        api.wait_ready()
        before = scrape(api.url + "/metrics")
        assert value(before, "webctx_broker_up") == 1
        assert value(before, "webctx_queue_depth", queue="search") == 0
        body = {"question": QUESTION, "max_sources": 10, "top_k": 6, "token_budget": 800}
        resp = httpx.post(api.url + "/v1/jobs", json=body, timeout=30)
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["job_id"]

        queued = scrape(api.url + "/metrics")
        assert value(queued, "webctx_jobs_total", status="queued") == 1
        # No worker yet: the plan message and the deadline watchdog wait in their queues.
        assert value(queued, "webctx_queue_depth", queue="search") == 1
        assert value(queued, "webctx_queue_depth", queue="rank") == 1
        assert value(queued, "webctx_queue_depth", queue="fetch") == 0

        start_worker(env, "-c", "4")
        deadline = time.monotonic() + 50
        while time.monotonic() < deadline:
            job = httpx.get(f"{api.url}/v1/jobs/{job_id}", timeout=10).json()
            status = job["status"]
            if status in ("succeeded", "failed"):
                break
            time.sleep(0.3)
        assert status == "succeeded", job
        after = scrape(api.url + "/metrics")
        assert value(after, "webctx_jobs_total", status="queued") == 1
        for queue in ("search", "fetch", "embed", "store", "rank"):  # the worker holds the watchdog
            assert value(after, "webctx_queue_depth", queue=queue) == 0, queue
    finally:
        api.stop()


def test_worker_metrics_match_the_bundle_on_threads_and_prefork_workers(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(
        **test_web.env(), CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q")
    )
    threads_port, prefork_port = free_port(), free_port()
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    (multiproc / "stale.db").write_bytes(b"")  # a previous run's file: cleared at start
    threads_env = {
        **env,
        "WEBCTX_METRICS_PORT": str(threads_port),
        "WEBCTX_METRICS_HOST": "127.0.0.1",
        "WEBCTX_LOG_FORMAT": "json",
    }
    prefork_env = {
        **env,
        "WEBCTX_METRICS_PORT": str(prefork_port),
        "WEBCTX_METRICS_HOST": "127.0.0.1",
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
    }
    # The vector store's queues need the threads pool (the embedded engine admits one
    # process); embedding runs anywhere, here in a prefork child, whose metrics the main
    # process serves summed with its siblings'.
    threads_worker = start_worker(threads_env, "-Q", "search,fetch,store,rank", "-n",
                                  "threads@%h", "-c", "8")  # fmt: skip
    start_worker(prefork_env, "-Q", "embed", "-n", "prefork@%h", "--pool", "prefork", "-c", "1")
    assert not (multiproc / "stale.db").exists()

    done = run_cli(env, "research", QUESTION, "--max-sources", "8", "--format", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    bundle = Bundle.model_validate_json(done.stdout)
    threads = scrape(f"http://127.0.0.1:{threads_port}/metrics")
    prefork = scrape(f"http://127.0.0.1:{prefork_port}/metrics")
    both = [threads, prefork]

    assert total(both, "webctx_jobs_total", status="running") == 1
    assert value(threads, "webctx_jobs_total", status="succeeded") == 1
    assert total(both, "webctx_pages_fetched_total") == bundle.stats.fetched > 0
    reasons = collections.Counter((f.stage, f.reason) for f in bundle.failures)
    assert reasons, "the test web's hostile pages should fail"
    for (stage, reason), count in reasons.items():
        assert total(both, "webctx_source_failures_total", stage=stage, reason=reason) == count
    # The embed side sends the chunks and, ahead of rank, the question: rank finds its
    # vector in the cache, so every request was counted by the prefork worker's children.
    assert value(prefork, "webctx_tokens_embedded_total") == bundle.stats.tokens_embedded > 0
    assert bundle.stats.tokens_embedded > count_tokens(QUESTION)
    assert value(prefork, "webctx_embed_requests_total") == bundle.stats.embed_requests
    assert value(threads, "webctx_tokens_embedded_total") == 0
    assert total(both, "webctx_chunks_total") == bundle.stats.chunks

    # One histogram observation per task: 1 plan, a search per query, a fetch per URL,
    # an embed and a store per distinct page text, 1 rank (the watchdog waits).
    def runs(samples: Samples, stage: str) -> float:
        return value(samples, "webctx_stage_duration_seconds_count", stage=stage)

    assert runs(threads, "plan") == 1
    assert runs(threads, "search") == bundle.stats.queries
    assert runs(threads, "fetch") == bundle.stats.fetched + sum(
        1 for f in bundle.failures if f.stage in ("fetch", "extract")
    )
    # (a page whose text another URL of the job got stored first needs neither)
    distinct = len({s.content_sha256 for s in bundle.sources})
    assert distinct <= runs(prefork, "embed") <= bundle.stats.fetched
    assert runs(prefork, "embed_question") == 1
    assert distinct <= runs(threads, "store") <= runs(prefork, "embed")
    assert runs(threads, "rank") == 1
    # Each task counted under the queue it was taken from (what the "queue unserved" alert
    # joins to webctx_queue_depth{queue}).
    assert value(threads, "webctx_tasks_total", stage="rank", queue="rank", state="success") == 1
    assert value(prefork, "webctx_tasks_total", stage="embed_question", queue="embed",
                 state="success") == 1  # fmt: skip
    # Failure series exist at zero before any failure, in prefork children too, so the
    # dashboard's ratios read 0, not "No data".
    labels = frozenset({"stage": "store", "reason": "worker_lost"}.items())
    zero = ("webctx_source_failures_total", labels)
    assert threads[zero] == prefork[zero] == 0
    assert value(prefork, "webctx_stage_duration_seconds_sum", stage="embed") > 0

    # JSON logs: every line a task logs names its job and task, passed or not.
    lines = [json.loads(line) for line in threads_worker.log.read_text().splitlines()
             if line.startswith("{")]
    planned = [x for x in lines if x["msg"] == "job planned"]
    assert planned and planned[0]["job_id"] == bundle.job_id and planned[0]["task_id"]
    in_tasks = [x for x in lines if x.get("task_id")]
    assert in_tasks and all(x["job_id"] == bundle.job_id for x in in_tasks)


def _span_collector() -> tuple[LoopbackServer, list[Any]]:
    """An OTLP/HTTP traces endpoint on loopback that keeps every span it is sent."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    spans: list[Any] = []

    async def traces(request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
        return Response(b"", media_type="application/x-protobuf")

    app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
    return LoopbackServer(app).start(), spans


def test_otel_traces_one_job_across_its_tasks(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    collector, spans = _span_collector()
    try:
        env = clean_env(
            **test_web.env(),
            CELERY_BROKER_URL=redis_url(),
            WEBCTX_QDRANT_PATH=str(tmp_path / "q"),
            WEBCTX_OTEL="true",
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
            OTEL_BSP_SCHEDULE_DELAY="200",
            OTEL_SERVICE_NAME="webctx-worker",
        )
        start_worker(env, "-c", "8")
        cli_env = {k: v for k, v in env.items() if k != "WEBCTX_OTEL"}
        done = run_cli(cli_env, "research", QUESTION, "--max-sources", "8")
        assert done.returncode == 0, done.stderr[-3000:]
        tasks = {f"run/webctx.{s}" for s in ("plan", "search", "fetch", "embed", "store", "rank")}
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not tasks <= {s.name for s in spans}:
            time.sleep(0.2)
        runs = [s for s in spans if s.name in tasks]
        assert {s.name for s in runs} == tasks, sorted({s.name for s in spans})
        # Celery's instrumentation carries the context in task headers: one trace per job.
        assert len({s.trace_id for s in runs}) == 1
        trace_id = runs[0].trace_id
        fetches = [s for s in spans if s.trace_id == trace_id and s.name.startswith("GET")]
        assert fetches, "httpx requests of the job are spans of its trace"
    finally:
        collector.stop()
