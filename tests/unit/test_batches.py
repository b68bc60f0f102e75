"""Batches: input validation, idempotent submission, the bounded and fair feeder (fakeredis)."""

from __future__ import annotations

import json
import threading
import time

import fakeredis
import pytest

from webctx.errors import BatchConflict, InvalidBatch
from webctx.jobs.batch_items import (
    BatchItem,
    batch_of_job,
    item_job_id,
    json_list_lines,
    parse_items,
)
from webctx.jobs.batches import BatchStore, FeedLimits, FeedOnItemEnd
from webctx.jobs.store import JobStore
from webctx.models import Bundle, JobRequest, JobStatus

LIMITS = FeedLimits(concurrency=3, max_inflight=4, job_timeout_s=100, grace_s=10)


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


@pytest.fixture
def jobs(client: fakeredis.FakeRedis) -> JobStore:
    return JobStore(client, ttl_s=600)


def _lines(n: int, **extra: object) -> list[str]:
    return [json.dumps({"id": f"q-{i}", "question": f"question {i}?", **extra}) for i in range(n)]


def _items(n: int) -> list[BatchItem]:
    return parse_items(_lines(n))


class Recorder:
    """A `Submit` that records the job as the pipeline would, without a broker."""

    def __init__(self, jobs: JobStore) -> None:
        self.jobs = jobs
        self.started: list[str] = []

    def __call__(self, job_id: str, request: JobRequest) -> None:
        self.jobs.create(request, job_id=job_id, batch=job_id.rpartition("-")[0])
        self.started.append(job_id)


def _finish(jobs: JobStore, job_id: str, status: JobStatus = JobStatus.SUCCEEDED) -> None:
    if status is JobStatus.SUCCEEDED:
        bundle = Bundle(job_id=job_id, question="q", queries=[], sources=[], chunks=[])
        jobs.save_bundle(job_id, bundle)
        jobs.add_counts(job_id, pages_downloaded=2, tokens_embedded=100)
    jobs.set_status(
        job_id, status, error=None if status is JobStatus.SUCCEEDED else "search failed"
    )


def test_bad_lines_are_refused_with_their_line_numbers() -> None:
    lines = [
        json.dumps({"id": "a", "question": "fine?"}),
        "{not json",
        json.dumps({"question": "no id?"}),
        json.dumps({"id": "a", "question": "again?"}),
        "",
        json.dumps({"id": "e", "question": "   "}),
        json.dumps({"id": "f", "question": "budget?", "token_budget": 1}),
    ]
    with pytest.raises(InvalidBatch) as caught:
        parse_items(lines)
    message = str(caught.value)
    for expected in (
        "line 2: not JSON",
        "line 3: missing id",
        "line 4: duplicate id 'a' (first on line 1)",
        "line 6: empty question",
        "line 7: token_budget",
    ):
        assert expected in message, message
    assert "line 1:" not in message and "line 5:" not in message


def test_defaults_apply_unless_an_item_sets_its_own() -> None:
    lines = [json.dumps({"id": 1, "question": "x?"}),
             json.dumps({"id": 2, "question": "y?", "max_sources": 2})]  # fmt: skip
    items = parse_items(lines, token_budget=1500, max_sources=5)
    assert [i.id for i in items] == ["1", "2"]
    assert [i.request.max_sources for i in items] == [5, 2]
    assert {i.request.token_budget for i in items} == {1500}


def test_same_name_and_file_is_the_same_batch_and_a_changed_file_is_refused(
    jobs: JobStore,
) -> None:
    store = BatchStore(jobs._redis, jobs)
    first, created = store.create("acme", "weekly", _items(3))
    again, created_again = store.create("acme", "weekly", _items(3))
    assert created and not created_again and first == again
    with pytest.raises(BatchConflict, match="different file"):
        store.create("acme", "weekly", _items(4))
    other, _ = store.create("globex", "weekly", _items(4))  # names are per tenant
    assert other != first


def test_feeder_keeps_at_most_concurrency_items_in_flight(jobs: JobStore) -> None:
    store = BatchStore(jobs._redis, jobs)
    batch_id, _ = store.create("acme", "b", _items(7))
    submit = Recorder(jobs)
    assert store.feed(batch_id, submit, LIMITS) == 3
    assert store.feed(batch_id, submit, LIMITS) == 0  # idempotent: nothing new to start
    status = store.status(batch_id)
    assert (status.running, status.queued, status.done) == (3, 4, 0)
    _finish(jobs, submit.started[0])
    _finish(jobs, submit.started[1], JobStatus.FAILED)
    assert store.feed(batch_id, submit, LIMITS) == 2
    status = store.status(batch_id)
    assert (status.running, status.queued, status.done, status.failed) == (3, 2, 1, 1)
    assert status.stats["pages_downloaded"] == 2 and status.stats["tokens_embedded"] == 100
    assert status.stats["item_failures_by_stage"] == {"search": 1}
    assert submit.started == [item_job_id(batch_id, i) for i in range(5)]


def test_batch_finishes_and_results_come_in_input_order(jobs: JobStore) -> None:
    store = BatchStore(jobs._redis, jobs)
    batch_id, _ = store.create("acme", "b", _items(5))
    submit = Recorder(jobs)
    while not store.status(batch_id).finished:
        store.feed(batch_id, submit, LIMITS)
        for job_id in reversed(submit.started):  # finish out of order
            if jobs.is_active(job_id):
                status = JobStatus.FAILED if job_id.endswith("-2") else JobStatus.SUCCEEDED
                _finish(jobs, job_id, status)
        store.feed(batch_id, submit, LIMITS)
    status = store.status(batch_id)
    assert status.state == "finished" and (status.done, status.failed) == (4, 1)
    results = list(store.results(batch_id))
    assert [r["id"] for r in results] == [f"q-{i}" for i in range(5)]
    assert results[2]["error"] == {"stage": "search", "message": "search failed"}
    assert results[0]["bundle"]["job_id"] == item_job_id(batch_id, 0)


def test_a_tenant_gets_only_its_share_when_another_tenant_waits(jobs: JobStore) -> None:
    store = BatchStore(jobs._redis, jobs)
    limits = FeedLimits(concurrency=8, max_inflight=4)
    big, _ = store.create("acme", "big", _items(20))
    submit = Recorder(jobs)
    assert store.feed(big, submit, limits) == 4  # alone: the whole cap
    small, _ = store.create("globex", "small", _items(5))
    assert store.feed(small, submit, limits) == 0  # cap full
    for job_id in submit.started[:2]:
        _finish(jobs, job_id)
    assert store.feed(big, submit, limits) == 0  # acme holds 2 = its share of 4 / 2 tenants
    assert store.feed(small, submit, limits) == 2


def test_cancel_stops_queued_items(jobs: JobStore) -> None:
    store = BatchStore(jobs._redis, jobs)
    batch_id, _ = store.create("acme", "b", _items(10))
    submit = Recorder(jobs)
    store.feed(batch_id, submit, LIMITS)
    store.cancel(batch_id)
    assert store.feed(batch_id, submit, LIMITS) == 0
    assert len(submit.started) == 3
    assert all(jobs.status(j) is JobStatus.CANCELLED for j in submit.started)
    status = store.status(batch_id)
    assert status.state == "cancelled" and status.finished
    assert (status.cancelled, status.running, status.queued) == (10, 0, 0)
    assert list(store.results(batch_id)) == []


def test_lost_jobs_are_fed_again_and_stuck_jobs_fail_at_the_deadline(jobs: JobStore) -> None:
    store = BatchStore(jobs._redis, jobs)
    batch_id, _ = store.create("acme", "b", _items(2))
    lost: list[str] = []
    store.feed(batch_id, lambda job_id, _request: lost.append(job_id), LIMITS, now=1000.0)
    assert store.status(batch_id).running == 2  # fed, but no job was ever recorded
    submit = Recorder(jobs)
    store.feed(batch_id, submit, LIMITS, now=1005.0)  # within the grace: still waiting
    assert submit.started == []
    store.feed(batch_id, submit, LIMITS, now=1020.0)  # past it: fed again
    assert sorted(submit.started) == sorted(lost)
    store.feed(batch_id, submit, LIMITS, now=1020.0 + 111)  # past the job deadline
    status = store.status(batch_id)
    assert status.failed == 2 and status.state == "finished"
    assert status.stats["item_failures_by_stage"] == {"deadline": 2}


def test_item_job_ids_name_their_batch() -> None:
    batch_id = "0123456789abcdef0123456789abcdef"
    assert batch_of_job(item_job_id(batch_id, 17)) == batch_id
    assert batch_of_job("0123456789abcdef0123456789abcdef") is None


def test_the_end_of_a_batch_items_job_feeds_its_batch_at_once(jobs: JobStore) -> None:
    fed: list[str] = []
    observed = JobStore(jobs._redis, ttl_s=600, observers=[FeedOnItemEnd(fed.append)])
    batch_id, _ = BatchStore(jobs._redis, jobs).create("alpha", "n", _items(2))
    item_job = item_job_id(batch_id, 0)
    interactive = observed.create(JobRequest(question="q"))
    observed.create(JobRequest(question="q"), job_id=item_job, batch=batch_id)
    observed.set_status(item_job, JobStatus.RUNNING)
    observed.set_status(interactive, JobStatus.SUCCEEDED)  # not a batch item
    assert fed == []
    observed.set_status(item_job, JobStatus.SUCCEEDED)
    assert fed == [batch_id]


def test_every_key_of_a_batch_expires_the_parts_written_after_creation_too(
    jobs: JobStore,
) -> None:
    store = BatchStore(jobs._redis, jobs)
    batch_id, _ = store.create("alpha", "n", _items(3))
    submit = Recorder(jobs)
    store.feed(batch_id, submit, LIMITS)
    for i in range(3):
        _finish(jobs, item_job_id(batch_id, i), JobStatus.FAILED if i else JobStatus.SUCCEEDED)
    store.feed(batch_id, submit, LIMITS)
    keys = list(jobs._redis.scan_iter(f"webctx:batch:{batch_id}*"))
    assert {k.rsplit(":", 1)[-1] for k in keys} >= {"outcome", "stats"}
    assert all(0 < jobs._redis.ttl(k) <= 600 for k in keys), keys


def test_a_cancel_waits_for_a_feed_step_in_progress(jobs: JobStore) -> None:
    store = BatchStore(jobs._redis, jobs)
    batch_id, _ = store.create("alpha", "n", _items(4))
    jobs._redis.set(f"webctx:batch:{batch_id}:lock", "a feeder", px=60_000)  # a step runs
    cancelling = threading.Thread(target=store.cancel, args=(batch_id,))
    cancelling.start()
    time.sleep(0.3)
    assert store.meta(batch_id)["state"] == "running"  # it waits instead of miscounting
    jobs._redis.delete(f"webctx:batch:{batch_id}:lock")
    cancelling.join(timeout=5)
    meta = store.meta(batch_id)
    assert (meta["state"], meta["cancelled"]) == ("cancelled", "4")


def test_deeply_nested_lines_and_items_are_refused_with_their_number() -> None:
    good = json.dumps({"id": "a", "question": "fine?"})
    deep = "[" * 5_000 + "]" * 5_000
    with pytest.raises(InvalidBatch, match=r"line 2: not JSON \(nested too deeply\)"):
        parse_items([good, deep])
    with pytest.raises(InvalidBatch, match=r"line 3: not JSON \(nested too deeply\)"):
        json_list_lines(f"[{good}, {good.replace('a', 'b', 1)}, {deep}]")
    assert json_list_lines(f" [ {good} ,\n{good} ] ") == [good, good]
    for broken in ("[", f"[{good}", f"[{good}] x", f"[{good} {good}]", "{}"):
        with pytest.raises(InvalidBatch):
            json_list_lines(broken)
