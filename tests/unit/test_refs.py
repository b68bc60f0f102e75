"""Jobs and batches named by a unique prefix of their id, among one tenant's (the ids the
progress lines show are 8 characters): real Redis, and `webctx status`, `bundle`,
`cancel` and `batch status` / `cancel` as subprocesses (no worker: a job or a batch that
is only queued can be looked up and cancelled)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import clean_env, redis_url, run_cli
from webctx.errors import BatchNotFound, InvalidRequest, JobNotFound
from webctx.jobs.batch_items import BatchItem
from webctx.jobs.batches import BatchStore
from webctx.jobs.refs import pick
from webctx.jobs.store import JobStore
from webctx.models import JobRequest

REQUEST = JobRequest(question="how do heat pumps work?")


def _job(jobs: JobStore, tenant: str, job_id: str) -> str:
    return jobs.create(REQUEST, job_id=job_id, tenant=tenant)


def _resolve(jobs: JobStore, tenant: str, ref: str) -> str:
    return pick("job", ref, exists=jobs.exists,
                with_prefix=lambda p: jobs.stored.jobs_with_prefix(tenant, p))  # fmt: skip


def test_a_unique_prefix_names_one_of_the_tenants_jobs_and_no_one_elses(
    redis_client: redis.Redis,
) -> None:
    jobs = JobStore(redis_client)
    mine = [_job(jobs, "alpha", f"abcd{n}{'0' * 27}") for n in (1, 2)]
    ours = _job(jobs, "alpha", "ef01" + "a" * 28)
    theirs = _job(jobs, "beta", "ef02" + "b" * 28)
    _job(jobs, "beta", "abcd3" + "b" * 27)
    assert _resolve(jobs, "alpha", "abcd1") == mine[0]
    assert _resolve(jobs, "alpha", "ef01") == ours
    with pytest.raises(JobNotFound):
        _resolve(jobs, "alpha", "ef02")  # beta's job: never found by alpha's prefix
    assert _resolve(jobs, "alpha", theirs) == theirs  # a full id, as before prefixes
    with pytest.raises(InvalidRequest, match=r"prefix 'abcd' matches 2 jobs \(abcd1.*abcd2"):
        _resolve(jobs, "alpha", "abcd")  # beta's abcd3… is not counted either
    with pytest.raises(InvalidRequest, match="too short: give at least 4 characters"):
        _resolve(jobs, "alpha", "ef0")
    with pytest.raises(InvalidRequest, match="ids hold letters"):
        _resolve(jobs, "alpha", "ab*d")  # no glob reaches the MATCH pattern
    with pytest.raises(JobNotFound):
        _resolve(jobs, "alpha", "9999")


def test_an_expired_job_is_no_candidate(redis_client: redis.Redis) -> None:
    jobs = JobStore(redis_client, ttl_s=1)
    gone = _job(jobs, "alpha", "dead" + "0" * 28)
    time.sleep(1.2)
    live = JobStore(redis_client)
    kept = _job(live, "alpha", "dead" + "1" * 28)
    assert not live.exists(gone)
    assert _resolve(live, "alpha", "dead") == kept


def test_a_batch_is_named_by_a_unique_prefix_among_its_tenants(
    redis_client: redis.Redis,
) -> None:
    batches = BatchStore(redis_client, JobStore(redis_client))
    items = [BatchItem(id="a", request=REQUEST)]
    first, _ = batches.create("alpha", "one", items)
    second, _ = batches.create("beta", "two", items)
    assert batches.resolve("alpha", first[:8]) == first
    assert batches.resolve("alpha", second) == second  # a full id
    with pytest.raises(BatchNotFound):
        batches.resolve("alpha", second[:8])


def test_the_cli_takes_the_short_ids_it_shows(redis_client: redis.Redis, tmp_path: Path) -> None:
    env = clean_env(CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    job_id = run_cli(env, "research", "how do heat pumps work?", "--no-wait").stdout.strip()
    assert len(job_id) == 32
    status = run_cli(env, "status", job_id[:8])
    assert status.returncode == 0, status.stderr[-2000:]
    assert json.loads(status.stdout)["job_id"] == job_id
    no_bundle = run_cli(env, "bundle", job_id[:8])
    assert no_bundle.returncode == 1 and f"job {job_id} has no bundle (queued)" in no_bundle.stderr
    short = run_cli(env, "status", job_id[:3])
    assert short.returncode == 2 and "too short" in short.stderr
    cancelled = run_cli(env, "cancel", job_id[:8])
    assert cancelled.returncode == 0, cancelled.stderr[-2000:]
    assert cancelled.stderr.strip() == f"cancelled job {job_id}"
    assert json.loads(cancelled.stdout)["status"] == "cancelled"
    again = run_cli(env, "cancel", job_id)
    assert again.returncode == 0 and "was cancelled already" in again.stderr
    unknown = run_cli(env, "cancel", "0123abcd")
    assert unknown.returncode == 1 and "not found" in unknown.stderr

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "a", "question": "what is a heat pump?"}) + "\n")
    batch_id = run_cli(env, "batch", "submit", str(questions), "--name", "p").stdout.strip()
    listed = run_cli(env, "batch", "status", batch_id[:8])
    assert listed.returncode == 0 and json.loads(listed.stdout)["id"] == batch_id
    stopped = run_cli(env, "batch", "cancel", batch_id[:8])
    assert stopped.returncode == 0 and "cancelled" in stopped.stderr
