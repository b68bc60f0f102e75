"""A client waiting on a job (`webctx research`) learns that it ended at once, not at its
next poll."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import anyio
import pytest
import redis

from webctx.cli.jobs import _until_finished
from webctx.cli.progress import wait_for_job
from webctx.jobs.store import JobStore
from webctx.models import JobRequest, JobStatus

FinishLater = Callable[[JobStore, str, float], None]


@pytest.fixture
def finish_later() -> Iterator[FinishLater]:
    """Set a job's status to succeeded after a delay, from another thread; joined before
    the test's Redis client closes (a waiter can wake while that thread still reads the
    transaction's reply)."""
    timers: list[threading.Timer] = []

    def later(jobs: JobStore, job_id: str, after_s: float) -> None:
        timer = threading.Timer(after_s, jobs.set_status, args=(job_id, JobStatus.SUCCEEDED))
        timer.start()
        timers.append(timer)

    yield later
    for timer in timers:
        timer.join(timeout=10)


def test_a_waiter_wakes_when_the_job_finishes(
    redis_client: redis.Redis, finish_later: FinishLater
) -> None:
    jobs = JobStore(redis_client, ttl_s=60)
    job = jobs.create(JobRequest(question="q"))
    finish_later(jobs, job, 0.2)
    started = time.monotonic()
    assert jobs.wait_finished(job, 20.0) is True
    assert time.monotonic() - started < 5.0  # woken by the finish, not the 20 s timeout


def test_every_waiter_of_a_job_wakes_and_a_late_one_returns_at_once(
    redis_client: redis.Redis,
    finish_later: FinishLater,
) -> None:
    jobs = JobStore(redis_client, ttl_s=60)
    job = jobs.create(JobRequest(question="q"))
    with ThreadPoolExecutor(3) as pool:
        waiters = [pool.submit(jobs.wait_finished, job, 20.0) for _ in range(3)]
        finish_later(jobs, job, 0.2)
        assert [w.result(timeout=10) for w in waiters] == [True, True, True]
    started = time.monotonic()
    assert jobs.wait_finished(job, 20.0) is True
    assert time.monotonic() - started < 5.0


def test_waiting_on_a_running_job_ends_at_the_timeout(redis_client: redis.Redis) -> None:
    jobs = JobStore(redis_client, ttl_s=60)
    job = jobs.create(JobRequest(question="q"))
    jobs.set_status(job, JobStatus.RUNNING)
    assert jobs.wait_finished(job, 0.1) is False


def test_the_cli_returns_when_the_job_finishes_not_at_its_next_poll(
    redis_client: redis.Redis,
    finish_later: FinishLater,
) -> None:
    jobs = JobStore(redis_client, ttl_s=60)
    job = jobs.create(JobRequest(question="q"))
    finish_later(jobs, job, 0.3)
    started = time.monotonic()
    progress = wait_for_job(lambda: jobs.progress(job), timeout_s=60, stream=io.StringIO(),
                            interval_s=30.0, pause=_until_finished(jobs, job))  # fmt: skip
    assert progress.status is JobStatus.SUCCEEDED
    assert time.monotonic() - started < 10.0  # a 30 s poll interval was not waited out


def test_an_api_or_mcp_call_answers_when_the_job_finishes_not_at_its_next_look(
    redis_client: redis.Redis,
    finish_later: FinishLater,
) -> None:
    from webctx.api.deps import wait_for_finish

    jobs = JobStore(redis_client, ttl_s=60)
    job = jobs.create(JobRequest(question="q"))
    # What wait_for_finish uses of a runtime: its job store and its keep-the-service hook.
    runtime = SimpleNamespace(jobs=jobs, keep_service=lambda: None)
    finish_later(jobs, job, 0.3)
    started = time.monotonic()
    progress = anyio.run(
        lambda: wait_for_finish(runtime, job, timeout_s=60.0, interval_s=30.0)  # type: ignore[arg-type]
    )
    assert progress.status is JobStatus.SUCCEEDED
    assert time.monotonic() - started < 10.0  # woken by the finish, not the 30 s interval
