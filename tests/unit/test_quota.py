"""Per-tenant stored bytes (webctx.jobs.quota) on a real Redis: what a job's request and
bundle add, expiry, the atomic refusal, and JobStore.create refusing past the limit."""

from __future__ import annotations

import threading

import pytest
import redis

from webctx.errors import QuotaExceeded
from webctx.jobs import quota
from webctx.jobs.quota import StoredBytes
from webctx.jobs.store import JobStore
from webctx.models import Bundle, JobRequest


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(quota.time, "time", fake)
    return fake


def test_a_jobs_request_and_bundle_count_to_its_tenant_only(redis_client: redis.Redis) -> None:
    jobs = JobStore(redis_client, ttl_s=600)
    request = JobRequest(question="how do lithium-ion batteries degrade?")
    job = jobs.create(request, tenant="alpha")
    jobs.create(request)  # no tenant: counted nowhere
    req_bytes = len(request.model_dump_json().encode())
    assert jobs.stored.total("alpha") == req_bytes
    assert jobs.stored.total("beta") == 0

    bundle = Bundle(job_id=job, question="q", queries=["q"], sources=[], chunks=[])
    assert jobs.save_bundle(job, bundle)
    assert not jobs.save_bundle(job, bundle)  # the second write stores nothing, adds nothing
    bundle_bytes = len(bundle.model_dump_json().encode())
    assert jobs.stored.total("alpha") == req_bytes + bundle_bytes
    for key in ("webctx:tenant:alpha:stored", "webctx:tenant:alpha:stored-bytes"):
        assert 0 < redis_client.ttl(key) <= 600


def test_expired_jobs_leave_the_sum(redis_client: redis.Redis, clock: Clock) -> None:
    stored = StoredBytes(redis_client, ttl_s=100)
    stored.add("alpha", "old", 700)
    clock.now += 60
    stored.add("alpha", "new", 300)
    assert stored.total("alpha") == 1_000
    clock.now += 50  # "old" expired (100 s after its write), "new" has 50 s left
    assert stored.total("alpha") == 300
    assert set(redis_client.hkeys("webctx:tenant:alpha:stored-bytes")) == {"new", "*"}
    clock.now += 60
    assert stored.total("alpha") == 0
    assert not redis_client.exists("webctx:tenant:alpha:stored-bytes")


def test_a_later_write_keeps_the_job_counted_longer(
    redis_client: redis.Redis, clock: Clock
) -> None:
    stored = StoredBytes(redis_client, ttl_s=100)
    stored.add("alpha", "job", 500)
    clock.now += 90
    stored.add("alpha", "job", 200)  # its bundle: the job's keys now live 100 s more
    clock.now += 50
    assert stored.total("alpha") == 700


def test_past_the_limit_nothing_is_counted_and_the_error_says_why(
    redis_client: redis.Redis,
) -> None:
    stored = StoredBytes(redis_client, ttl_s=100)
    stored.add("alpha", "a", 900, limit=1_000)
    with pytest.raises(QuotaExceeded) as refused:
        stored.add("alpha", "b", 101, limit=1_000)
    assert refused.value.stored_bytes == 900 and refused.value.limit_bytes == 1_000
    assert "WEBCTX_TENANT_MAX_STORED_BYTES" in str(refused.value)
    with pytest.raises(QuotaExceeded):
        stored.check("alpha", 101, limit=1_000)
    assert stored.total("alpha") == 900
    stored.add("alpha", "b", 100, limit=1_000)  # exactly at the limit is allowed
    stored.add("alpha", "c", 10**9)  # no limit (0): counted, never refused
    stored.check("beta", 1_000, limit=1_000)  # another tenant's sum is its own


def test_racing_submissions_cannot_both_take_the_last_bytes(redis_client: redis.Redis) -> None:
    stored = StoredBytes(redis_client, ttl_s=100)
    outcomes: list[bool] = []

    def submit(job: str) -> None:
        try:
            stored.add("alpha", job, 600, limit=1_000)
            outcomes.append(True)
        except QuotaExceeded:
            outcomes.append(False)

    threads = [threading.Thread(target=submit, args=(f"j{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == [False] * 7 + [True]
    assert stored.total("alpha") == 600


def test_create_refuses_a_job_past_the_limit_and_records_nothing(
    redis_client: redis.Redis,
) -> None:
    jobs = JobStore(redis_client, ttl_s=600)
    request = JobRequest(question="q" * 500)
    size = len(request.model_dump_json().encode())
    jobs.create(request, tenant="alpha", max_stored_bytes=size * 2)
    jobs.create(request, tenant="alpha", max_stored_bytes=size * 2)
    with pytest.raises(QuotaExceeded):
        jobs.create(request, job_id="refused", tenant="alpha", max_stored_bytes=size * 2)
    assert not jobs.exists("refused")
    jobs.create(request, tenant="beta", max_stored_bytes=size * 2)
