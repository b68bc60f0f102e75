"""JobStore: fan-in completion semantics, idempotent records, expiry (fakeredis)."""

from __future__ import annotations

from collections.abc import Mapping

import fakeredis
import pytest

from tests.factories import make_page
from webctx.errors import JobNotFound
from webctx.jobs.store import JobStore
from webctx.models import Failure, JobRequest, JobStatus, SearchResult


@pytest.fixture
def jobs() -> JobStore:
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=60)


def test_only_the_completion_that_fills_the_set_starts_the_next_stage(jobs: JobStore) -> None:
    job = jobs.create(JobRequest(question="q"))
    assert jobs.complete(job, "search", "0", total=3) is False
    assert jobs.complete(job, "search", "1", total=3) is False
    assert jobs.complete(job, "search", "2", total=3) is True
    jobs.mark_next_started(job, "search")
    # A redelivered task for an item already counted starts nothing more.
    assert jobs.complete(job, "search", "2", total=3) is False
    assert jobs.complete(job, "search", "0", total=3) is False


def test_redelivery_restarts_next_stage_when_its_starter_died(jobs: JobStore) -> None:
    job = jobs.create(JobRequest(question="q"))
    assert jobs.complete(job, "fetch", "a", total=1) is True
    # The starter died before recording the next stage: the redelivered task starts it.
    assert jobs.complete(job, "fetch", "a", total=1) is True
    jobs.mark_next_started(job, "fetch")
    assert jobs.complete(job, "fetch", "a", total=1) is False


def test_finished_job_never_changes_status(jobs: JobStore) -> None:
    job = jobs.create(JobRequest(question="q"))
    jobs.set_status(job, JobStatus.RUNNING)
    jobs.set_status(job, JobStatus.CANCELLED)
    jobs.set_status(job, JobStatus.SUCCEEDED)
    assert jobs.status(job) is JobStatus.CANCELLED
    assert not jobs.is_active(job)


def test_pages_are_shared_by_hash_and_failed_urls_are_excluded(jobs: JobStore) -> None:
    job = jobs.create(JobRequest(question="q"))
    ids = jobs.set_urls(job, ["http://a.example/1", "http://b.example/2"])
    a, b = list(ids)
    page = make_page()
    jobs.save_page(job, a, page)
    jobs.save_page(job, b, make_page(text="other text entirely", content_sha256="f" * 64))
    jobs.add_failure(job, b, Failure(url=ids[b], stage="embed", error="boom"))
    assert list(jobs.pages(job)) == [page.content_sha256]
    assert jobs.page_for(job, a) == page


def test_search_results_come_back_in_query_order(jobs: JobStore) -> None:
    job = jobs.create(JobRequest(question="q"))
    jobs.save_search(job, 1, [SearchResult(url="http://b.example", rank=0)])
    jobs.save_search(job, 0, [SearchResult(url="http://a.example", rank=0)])
    jobs.save_search(job, 1, [SearchResult(url="http://b.example", rank=0)])  # rerun
    assert [[r.url for r in rs] for rs in jobs.search_results(job)] == [
        ["http://a.example"],
        ["http://b.example"],
    ]


def test_bundle_is_written_once(jobs: JobStore) -> None:
    from webctx.models import Bundle

    job = jobs.create(JobRequest(question="q"))
    first = Bundle(job_id=job, question="q", queries=["q"], sources=[], chunks=[])
    assert jobs.save_bundle(job, first) is True
    assert jobs.save_bundle(job, first.model_copy(update={"question": "x"})) is False
    assert jobs.bundle(job) == first


def test_every_job_key_expires(jobs: JobStore) -> None:
    job = jobs.create(JobRequest(question="q"))
    jobs.set_urls(job, ["http://a.example"])
    jobs.add_counts(job, chunks=3)
    jobs.complete(job, "search", "0", total=2)
    jobs.set_status(job, JobStatus.SUCCEEDED)
    for key in jobs._redis.scan_iter(f"webctx:job:{job}:*"):
        assert 0 < jobs._redis.ttl(key) <= 60, key


def test_unknown_job_raises_not_found(jobs: JobStore) -> None:
    with pytest.raises(JobNotFound):
        jobs.progress("nope")


def test_completion_with_no_items_starts_nothing(jobs: JobStore) -> None:
    # A task finishing after Redis came back empty sees zero URLs: never start a stage.
    job = jobs.create(JobRequest(question="q"))
    assert jobs.complete(job, "embed", "a", total=0) is False


def test_progress_of_a_record_without_status_is_not_found(jobs: JobStore) -> None:
    # A stray write after Redis came back empty leaves fields but no status.
    jobs._redis.hset("webctx:job:ghost:meta", "next:embed", "1")
    with pytest.raises(JobNotFound):
        jobs.progress("ghost")


class Recorder:
    """A JobObserver keeping every fact it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, object]]] = []

    def job_event(self, event: str, job_id: str, facts: Mapping[str, object]) -> None:
        self.events.append((event, job_id, dict(facts)))


def test_a_store_tells_only_the_observers_it_was_built_with() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    told, other = Recorder(), Recorder()
    watched, plain = JobStore(client, observers=[told]), JobStore(client)
    job = watched.create(JobRequest(question="q"))
    plain.set_status(job, JobStatus.RUNNING)  # the same job, through a store told nothing
    watched.add_counts(job, chunks=3)
    assert [e[0] for e in told.events] == ["status", "counts"]
    assert told.events[1] == ("counts", job, {"chunks": 3})
    assert other.events == []
