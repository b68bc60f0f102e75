"""The hold queue of per-tenant admission (webctx.jobs.admission) on a real Redis: jobs past
`running` are held with no task sent, each is published exactly once when a slot frees (two
processes freeing slots at once included), a held job that is cancelled is never published,
and the reconciler publishes held jobs whose tenant has free slots (lapsed, or freed by a
process that sends no tasks), so no job is held for ever."""

from __future__ import annotations

import threading

import pytest
import redis

from webctx.jobs import admission
from webctx.jobs.admission import HELD_TENANTS, Caps, Slot
from webctx.jobs.store import JobStore
from webctx.models import JobRequest, JobStatus

CAPS = Caps(running=2, queued=4, retry_after_s=5, lapse_s=600)
REQUEST = JobRequest(question="how do lithium-ion batteries degrade?")


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Sent:
    """A publisher that records what it sent (thread-safe: list.append)."""

    def __init__(self) -> None:
        self.jobs: list[str] = []

    def __call__(self, job_id: str) -> None:
        self.jobs.append(job_id)


def _store(client: redis.Redis, sent: Sent | None) -> JobStore:
    jobs = JobStore(client, ttl_s=600)
    if sent is not None:
        jobs.admission.serve(CAPS, sent)
    return jobs


def _submit(jobs: JobStore, sent: Sent, n: int, tenant: str = "alpha") -> list[str]:
    """What the API's submission does: admit, record, then publish (front) or hold."""
    ids = []
    for _ in range(n):
        job_id = jobs.create(REQUEST, tenant=tenant)
        slot = jobs.admission.admit(tenant, job_id, CAPS)
        if slot is Slot.FRONT:
            sent(job_id)
        else:
            assert slot is Slot.HELD
            jobs.admission.hold(tenant, job_id)
        ids.append(job_id)
    return ids


def _client(client: redis.Redis) -> redis.Redis:
    kw = client.connection_pool.connection_kwargs
    return redis.Redis(host=kw["host"], port=kw["port"], db=kw["db"], decode_responses=True)


def test_jobs_past_running_are_held_with_no_task_sent_oldest_first(
    redis_client: redis.Redis,
) -> None:
    sent = Sent()
    jobs = _store(redis_client, sent)
    ids = _submit(jobs, sent, 5)
    assert sent.jobs == ids[:2]
    assert jobs.admission.held("alpha") == ids[2:]
    assert jobs.admission.counts("alpha") == (2, 3)
    assert redis_client.sismember(HELD_TENANTS, "alpha")
    jobs.set_status(ids[1], JobStatus.SUCCEEDED)  # a slot frees: the oldest held job takes it
    assert sent.jobs == [*ids[:2], ids[2]]
    assert jobs.admission.held("alpha") == ids[3:]
    assert jobs.admission.counts("alpha") == (2, 2)


def _finish(client: redis.Redis, sent: Sent, barrier: threading.Barrier, job_id: str) -> None:
    jobs = _store(_client(client), sent)  # its own connection, as another process's
    barrier.wait()
    jobs.set_status(job_id, JobStatus.SUCCEEDED)


def test_two_processes_freeing_slots_at_once_publish_each_held_job_once(
    redis_client: redis.Redis,
) -> None:
    for _ in range(20):  # the race, many times over
        redis_client.flushdb()
        submitter_sent = Sent()
        ids = _submit(_store(redis_client, submitter_sent), submitter_sent, 5)
        barrier = threading.Barrier(2)
        sent = [Sent(), Sent()]
        threads = [threading.Thread(target=_finish, args=(redis_client, sent[i], barrier, ids[i]))
                   for i in range(2)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        published = sent[0].jobs + sent[1].jobs
        assert sorted(published) == sorted(ids[2:4])  # each once, the two oldest
        assert JobStore(redis_client).admission.held("alpha") == ids[4:]


def test_a_held_job_cancelled_is_never_published_and_ends_cancelled(
    redis_client: redis.Redis,
) -> None:
    sent = Sent()
    jobs = _store(redis_client, sent)
    ids = _submit(jobs, sent, 4)
    jobs.set_status(ids[2], JobStatus.CANCELLED, error="cancelled by the client")
    assert jobs.admission.held("alpha") == [ids[3]]
    jobs.set_status(ids[0], JobStatus.SUCCEEDED)
    jobs.set_status(ids[1], JobStatus.FAILED)
    assert jobs.admission.reconcile(CAPS, sent) == []
    assert sent.jobs == [ids[0], ids[1], ids[3]]
    assert jobs.status(ids[2]) is JobStatus.CANCELLED
    assert not redis_client.sismember(HELD_TENANTS, "alpha")  # nothing held: off the list


def test_the_reconciler_publishes_into_slots_a_silent_process_freed_once(
    redis_client: redis.Redis,
) -> None:
    sent = Sent()
    ids = _submit(_store(redis_client, sent), sent, 4)
    _store(redis_client, None).set_status(ids[0], JobStatus.CANCELLED)  # a store with no publisher
    assert sent.jobs == ids[:2]  # freed, not published: that process sends no tasks
    gate = _store(redis_client, None).admission
    assert gate.reconcile(CAPS, sent) == [ids[2]]
    assert gate.reconcile(CAPS, sent) == []  # idempotent
    assert sent.jobs == [*ids[:2], ids[2]]
    assert gate.held("alpha") == [ids[3]]


def test_the_reconciler_publishes_held_jobs_once_the_front_slots_lapse(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Front jobs whose every message (and release) was lost hold their slots until they
    lapse; the held jobs, admitted later, lapse later, and are published then."""
    clock = Clock()
    monkeypatch.setattr(admission.time, "time", clock)
    sent = Sent()
    jobs = _store(redis_client, sent)
    front = _submit(jobs, sent, 2)
    held = []
    for i in range(3):  # one at a time, as a burst's POSTs arrive
        clock.now += 100 if i == 0 else 0.001
        held += _submit(jobs, sent, 1)
    assert jobs.admission.reconcile(CAPS, sent) == []
    clock.now += CAPS.lapse_s - 99  # the front slots lapsed, the held ones not yet
    assert jobs.admission.reconcile(CAPS, sent) == held[:2]
    assert sent.jobs == [*front, *held[:2]]
    clock.now += 100  # every slot lapsed: the held job's watchdog has ended it by now
    assert jobs.admission.reconcile(CAPS, sent) == []
    assert jobs.admission.held("alpha") == []
    assert not redis_client.sismember(HELD_TENANTS, "alpha")


def test_held_keys_expire_and_a_job_whose_sending_failed_is_held_again(
    redis_client: redis.Redis,
) -> None:
    sent = Sent()
    jobs = _store(redis_client, sent)
    ids = _submit(jobs, sent, 5)
    for key in ("webctx:tenant:alpha:held", HELD_TENANTS):
        assert 0 < int(redis_client.ttl(key)) <= CAPS.lapse_s + 1  # type: ignore[arg-type]

    def broken(job_id: str) -> None:
        raise ConnectionError("broker down")

    jobs.admission.serve(CAPS, broken)
    jobs.set_status(ids[0], JobStatus.SUCCEEDED)  # the job is still ended, its slot freed
    assert jobs.status(ids[0]) is JobStatus.SUCCEEDED
    assert jobs.admission.held("alpha") == ids[2:]  # not sent: held again, at the head
    assert jobs.admission.counts("alpha") == (1, 3)
    assert jobs.admission.reconcile(CAPS, sent) == [ids[2]]  # the next tick sends it
    jobs.admission.serve(CAPS, sent)
    jobs.set_status(ids[1], JobStatus.SUCCEEDED)
    assert sent.jobs == [*ids[:2], ids[2], ids[3]]


def test_a_batch_feeds_one_item_at_a_time_while_other_tenants_interactive_jobs_run(
    redis_client: redis.Redis,
) -> None:
    from webctx.jobs.batch_items import parse_items
    from webctx.jobs.batches import BatchStore, FeedLimits

    sent = Sent()
    jobs = _store(redis_client, sent)
    batches = BatchStore(redis_client, jobs)
    lines = [f'{{"id": "q-{i}", "question": "question {i}?"}}' for i in range(6)]
    batch_id, _ = batches.create("gamma", "nightly", parse_items(lines))
    fed: list[str] = []

    def submit(job_id: str, request: JobRequest) -> None:
        jobs.create(request, job_id=job_id, tenant="gamma", batch=batch_id)
        fed.append(job_id)

    limits = FeedLimits(concurrency=3, max_inflight=8, beside_interactive=1)
    _submit(jobs, sent, 1, tenant="gamma")  # the batch's own tenant's jobs do not count
    assert batches.feed(batch_id, submit, limits) == 3
    jobs.set_status(fed[0], JobStatus.SUCCEEDED)
    jobs.set_status(fed[1], JobStatus.SUCCEEDED)
    interactive = _submit(jobs, sent, 1, tenant="beta")
    assert batches.feed(batch_id, submit, limits) == 0  # one still in flight: no more
    jobs.set_status(fed[2], JobStatus.SUCCEEDED)
    assert batches.feed(batch_id, submit, limits) == 1
    jobs.set_status(interactive[0], JobStatus.SUCCEEDED)  # beta's job ended: full speed
    assert batches.feed(batch_id, submit, limits) == 2


def test_beats_admission_tick_publishes_held_jobs_into_free_slots(
    redis_client: redis.Redis, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webctx.settings import Settings
    from webctx.workers import app as worker_app
    from webctx.workers import tasks
    from webctx.workers.deps import build_deps

    kw = redis_client.connection_pool.connection_kwargs
    settings = Settings(broker_url=f"redis://{kw['host']}:{kw['port']}/{kw['db']}",
                        embedding_provider="hash", qdrant_path=f"{tmp_path}/q")  # fmt: skip
    sent, tick_sent = Sent(), Sent()
    ids = _submit(_store(redis_client, sent), sent, 3)
    _store(redis_client, None).set_status(ids[0], JobStatus.CANCELLED)
    monkeypatch.setattr(worker_app, "publish_held", tick_sent)
    worker_app.set_deps(build_deps(settings, start=lambda stage, arguments: None))
    try:
        assert tasks.admission_tick.run() == 1
        assert tasks.admission_tick.run() == 0
    finally:
        worker_app.set_deps(None)
    assert tick_sent.jobs == [ids[2]]
