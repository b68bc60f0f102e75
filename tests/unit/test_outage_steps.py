"""A job's steps meeting a provider that is down (its shared breaker open): the job ends
failed as a provider failure, with the outage's one line and reason `provider_down`, and
no page or query is counted as failed; a job planned while the breaker is open fails at
once. On the test Redis (the breaker is Lua), with the steps called in-process."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis

from tests.conftest import redis_url
from tests.factories import make_page
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.errors import ProviderDown, ProviderUnavailable
from webctx.jobs import pages, steps
from webctx.jobs.engine import Engine
from webctx.models import JobRequest, JobStatus, SearchResult
from webctx.net.breaker import (
    BreakerPolicy,
    Endpoint,
    GuardedEmbedder,
    GuardedSearch,
    ProviderBreaker,
)
from webctx.protocols import Embeddings
from webctx.settings import Settings

POLICY = BreakerPolicy(outage_s=0.2, cooldown_s=30, probe_lease_s=2)
EMBEDDINGS = Endpoint("embeddings", "openai", "http://127.0.0.1:8/v1", "OPENAI_BASE_URL")
SEARCH = Endpoint("search", "searxng", "http://127.0.0.1:9", "WEBCTX_SEARXNG_URL")


class Down:
    """A provider answering 500 to everything (an embedder and a search in one)."""

    name, model = "searxng", "hash-embedding"

    def embed(self, texts: Sequence[str]) -> Embeddings:
        raise ProviderUnavailable("openai: HTTP 500", kind="status", detail="HTTP 500")

    def search(
        self, query: str, *, limit: int, recency_days: int | None = None
    ) -> list[SearchResult]:
        raise ProviderUnavailable("searxng: HTTP 500", kind="status", detail="HTTP 500")


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    from webctx.workers.deps import build_engine, stores_on

    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    settings = Settings(redis_url=redis_url(), embedding_provider="hash",
                        qdrant_path=tmp_path / "q")  # fmt: skip
    built = build_engine(settings, stores_on(client, settings), state=client,
                         start=lambda stage, arguments: None)  # fmt: skip
    embed = ProviderBreaker(client, EMBEDDINGS, POLICY)
    search = ProviderBreaker(client, SEARCH, POLICY)
    down = Down()
    guarded = {"embedder": GuardedEmbedder(down, embed), "search": GuardedSearch(down, search)}
    yield dataclasses.replace(built, breakers=(search, embed), **guarded)  # type: ignore[arg-type]
    client.flushdb()
    client.close()


def open_breaker(breaker: ProviderBreaker) -> ProviderDown:
    for _ in range(2):
        try:
            breaker.call(lambda: Down().embed(["x"]))
        except ProviderDown as down:
            return down
        except ProviderUnavailable:
            time.sleep(POLICY.outage_s + 0.05)
    raise AssertionError("the breaker did not open")


class Later(Exception):
    """A task's retry, raised."""


def never_retry(exc: Exception) -> None:
    raise AssertionError(f"retried although the provider is known down: {exc!r}")


def test_a_page_meeting_its_embeddings_provider_down_fails_the_job_not_the_page(
    engine: Engine,
) -> None:
    down = open_breaker(engine.breakers[1])
    job_id = engine.jobs.create(JobRequest(question="how do batteries age?"))
    (url_id,) = engine.jobs.set_urls(job_id, ["https://example.org/a"]).values()
    engine.jobs.save_page(job_id, url_id, make_page(url="https://example.org/a"))
    pages.embed_one(engine, job_id, url_id, retry=never_retry)
    progress = engine.jobs.progress(job_id)
    assert progress.status is JobStatus.FAILED and progress.reason == "provider_down"
    assert progress.error == str(down) and "embeddings provider openai at" in str(down)
    assert progress.failed == 0 and engine.jobs.failures(job_id) == []
    assert progress.embedded == 0  # not settled: the job is over, nothing waits for it


def test_a_job_planned_while_a_provider_is_down_fails_at_once(engine: Engine) -> None:
    down = open_breaker(engine.breakers[0])
    job_id = engine.jobs.create(JobRequest(question="how do batteries age?"))
    started = time.monotonic()
    steps.plan_job(engine, job_id)
    assert time.monotonic() - started < 1
    progress = engine.jobs.progress(job_id)
    assert progress.status is JobStatus.FAILED and progress.error == str(down)
    assert progress.reason == "provider_down" and engine.jobs.queries(job_id) == []


def test_a_search_that_opens_the_breaker_ends_the_job_without_a_query_failure(
    engine: Engine,
) -> None:
    job_id = engine.jobs.create(JobRequest(question="how do batteries age?"))
    engine.jobs.set_queries(job_id, ["batteries age"])

    def later(exc: Exception) -> None:  # as Celery's retry: the task ends, to run again
        raise Later(exc)

    with pytest.raises(Later) as first:  # the first failure: retried by the verdict
        steps.search_one(engine, job_id, 0, retry=later)
    failed = first.value.args[0]
    assert isinstance(failed, ProviderUnavailable) and failed.verdict_in_s is not None
    assert failed.verdict_in_s <= POLICY.outage_s + 0.1
    assert engine.jobs.is_active(job_id) and engine.jobs.failures(job_id) == []
    time.sleep(POLICY.outage_s + 0.05)
    steps.search_one(engine, job_id, 0, retry=never_retry)  # the retry: down
    progress = engine.jobs.progress(job_id)
    assert progress.status is JobStatus.FAILED and progress.reason == "provider_down"
    said = "search provider searxng at http://127.0.0.1:9 answered HTTP 500 for "
    assert (progress.error or "").startswith(said)
    assert progress.failed == 0


def test_a_healthy_provider_leaves_jobs_alone(engine: Engine) -> None:
    embedder = GuardedEmbedder(HashEmbedder(), engine.breakers[1])
    healthy = dataclasses.replace(engine, embedder=embedder)
    job_id = healthy.jobs.create(JobRequest(question="how do batteries age?"))
    (url_id,) = healthy.jobs.set_urls(job_id, ["https://example.org/a"]).values()
    healthy.jobs.save_page(job_id, url_id, make_page(url="https://example.org/a"))
    pages.embed_one(healthy, job_id, url_id, retry=never_retry)
    assert healthy.jobs.is_active(job_id) and healthy.jobs.failures(job_id) == []
