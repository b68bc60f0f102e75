"""Metrics a fresh process exports before anything happened: every known failure, job status
and 429 peer as a series at zero (so the dashboard's ratios read 0, not "No data"), and the
queue a task came from on its task counter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from webctx.models import JobStatus
from webctx.workers import metrics
from webctx.workers.app import app

ROOT = Path(__file__).resolve().parents[2]
SCRAPE = "from prometheus_client import generate_latest; import webctx.workers.metrics; " \
         "print(generate_latest().decode())"  # fmt: skip


def fresh_samples() -> dict[tuple[str, frozenset[Any]], float]:
    """What a new process's default registry exposes right after importing the metrics."""
    done = subprocess.run(
        [sys.executable, "-c", SCRAPE], capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(done.stdout)
        for s in family.samples
    }


def test_a_fresh_scrape_shows_every_known_failure_status_and_peer_at_zero() -> None:
    samples = fresh_samples()
    failures = {
        dict(labels)["stage"] + "/" + dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "webctx_source_failures_total"
    }
    expected = {f"{s}/{r}" for s in metrics.FAILURE_STAGES for r in metrics.FAILURE_REASONS}
    assert set(failures) == expected and set(failures.values()) == {0.0}
    # the reasons the dashboard's "fetch|extract" ratio and "by reason" panels need
    assert {"fetch/timeout", "fetch/blocked", "extract/extraction", "fetch/http_status"} <= expected
    for status in JobStatus:
        assert samples[("webctx_jobs_total", frozenset({("status", status.value)}))] == 0
    for peer in ("embeddings", "search", "site"):
        assert samples[("webctx_rate_limited_total", frozenset({("peer", peer)}))] == 0


def test_every_failure_reason_written_in_the_code_is_initialised() -> None:
    written = set()
    for path in [*(ROOT / "webctx").rglob("*.py"), *(ROOT / "workers").rglob("*.py")]:
        text = path.read_text()
        written |= set(re.findall(r"\breason=\"(\w+)\"", text))
        written |= set(re.findall(r"^\s+reason = \"(\w+)\"", text, flags=re.M))
    assert written and written <= set(metrics.FAILURE_REASONS), written
    assert "error" in metrics.FAILURE_REASONS  # Failure's default


def _task(name: str, delivery_info: dict[str, Any] | None) -> SimpleNamespace:
    return SimpleNamespace(name=name, app=app, request=SimpleNamespace(delivery_info=delivery_info))


def test_a_task_is_counted_under_the_queue_it_was_taken_from() -> None:
    def count(queue: str) -> float:
        return metrics.TASKS.labels(stage="index.tick", queue=queue, state="success")._value.get()

    before = count("reindex"), count("rank")
    metrics._on_postrun("t1", _task("webctx.index.tick", {"routing_key": "reindex"}), "SUCCESS")
    # Sent with an explicit queue: the delivery says so, not the route.
    metrics._on_postrun("t2", _task("webctx.index.tick", {"routing_key": "rank"}), "SUCCESS")
    # No delivery info (a direct call): the configured route.
    metrics._on_postrun("t3", _task("webctx.index.tick", None), "SUCCESS")
    assert (count("reindex"), count("rank")) == (before[0] + 2, before[1] + 1)


def test_search_requests_are_counted_by_provider_and_outcome() -> None:
    samples = fresh_samples()
    for provider in ("ddgs", "searxng", "brave", "tavily", "exa", "serper"):
        for outcome in ("answered", "failed", "skipped"):
            labels = frozenset({("provider", provider), ("outcome", outcome)})
            assert samples[("webctx_search_requests_total", labels)] == 0

    def count(provider: str, outcome: str) -> float:
        return metrics.SEARCH_REQUESTS.labels(provider=provider, outcome=outcome)._value.get()

    before = count("brave", "failed"), count("searxng", "answered"), count("brave", "skipped")
    metrics.MetricsObserver().job_event("counts", "j1", {
        "search_failed:brave": 1, "search_requests:brave": 1, "search_answered:searxng": 1,
        "search_requests:searxng": 1})  # fmt: skip
    metrics.MetricsObserver().job_event("counts", "j2", {"search_skipped:brave": 1})
    after = count("brave", "failed"), count("searxng", "answered"), count("brave", "skipped")
    assert after == (before[0] + 1, before[1] + 1, before[2] + 1)
