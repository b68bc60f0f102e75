"""Per-tenant admission (webctx.jobs.admission) on a real Redis: the two caps, the refusal
in plain words, atomicity across concurrent submitters, slots freed by a job's end and by
their lapse."""

from __future__ import annotations

import threading

import pytest
import redis

from webctx.errors import TooManyJobs, TooManyRequests
from webctx.jobs import admission
from webctx.jobs.admission import Admission, Caps, Slot
from webctx.jobs.store import JobStore
from webctx.models import JobRequest, JobStatus

CAPS = Caps(running=2, queued=3, retry_after_s=7, lapse_s=600)
REQUEST = JobRequest(question="how do lithium-ion batteries degrade?")


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(admission.time, "time", fake)
    return fake


def test_first_jobs_go_in_front_then_behind_then_are_refused_in_one_line(
    redis_client: redis.Redis,
) -> None:
    gate = Admission(redis_client)
    slots = [gate.admit("alpha", f"j{i}", CAPS) for i in range(5)]
    assert slots == [Slot.FRONT] * 2 + [Slot.HELD] * 3
    with pytest.raises(TooManyJobs) as refused:
        gate.admit("alpha", "j5", CAPS)
    assert isinstance(refused.value, TooManyRequests)  # a 429 wherever TooManyRequests is
    assert refused.value.retry_after_s == 7 and refused.value.unfinished == 5
    message = str(refused.value)
    assert "\n" not in message
    assert "WEBCTX_ADMISSION__RUNNING=2" in message and "WEBCTX_ADMISSION__QUEUED=3" in message
    assert "retry in 7 s" in message and "5 unfinished jobs" in message
    assert gate.counts("alpha") == (2, 3)  # the refused job took nothing
    assert gate.admit("beta", "k0", CAPS) is Slot.FRONT  # another tenant's caps are its own
    tiers = Caps(running=1, queued=1, retry_after_s=7, lapse_s=600, hold=False)
    assert [gate.admit("gamma", f"g{i}", tiers) for i in range(2)] == [Slot.FRONT, Slot.BEHIND]


def test_a_job_admitted_again_keeps_its_slot_and_takes_no_other(
    redis_client: redis.Redis,
) -> None:
    gate = Admission(redis_client)
    assert gate.admit("alpha", "j0", CAPS) is Slot.FRONT
    assert gate.admit("alpha", "j0", CAPS) is Slot.FRONT
    assert gate.admit("alpha", "j1", CAPS) is Slot.FRONT
    assert gate.admit("alpha", "j2", CAPS) is Slot.HELD
    assert gate.admit("alpha", "j2", CAPS) is Slot.HELD
    assert gate.counts("alpha") == (2, 1)


def test_concurrent_submitters_never_pass_the_caps_together(redis_client: redis.Redis) -> None:
    """24 threads, each its own connection, admit at once: exactly 2 + 3 get a slot."""
    n = 24
    barrier = threading.Barrier(n)
    slots: list[Slot | None] = [None] * n
    url = redis_client.connection_pool.connection_kwargs
    client_kwargs = {k: url[k] for k in ("host", "port", "db")}

    def submitter(i: int) -> None:
        gate = Admission(redis.Redis(**client_kwargs, decode_responses=True))
        barrier.wait()
        try:
            slots[i] = gate.admit("alpha", f"j{i}", CAPS)
        except TooManyJobs:
            slots[i] = None

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert slots.count(Slot.FRONT) == 2 and slots.count(Slot.HELD) == 3, slots
    assert slots.count(None) == n - 5
    assert Admission(redis_client).counts("alpha") == (2, 3)


@pytest.mark.parametrize("end", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED])
def test_a_finished_job_frees_its_slot_for_the_next(
    redis_client: redis.Redis, end: JobStatus
) -> None:
    jobs = JobStore(redis_client, ttl_s=600)
    held = []
    for _ in range(5):
        job_id = jobs.create(REQUEST, tenant="alpha")
        jobs.admission.admit("alpha", job_id, CAPS)
        held.append(job_id)
    with pytest.raises(TooManyJobs):
        jobs.admission.admit("alpha", "next", CAPS)
    jobs.set_status(held[0], JobStatus.RUNNING)  # running still holds it
    assert jobs.admission.counts("alpha") == (2, 3)
    jobs.set_status(held[0], end)
    assert jobs.admission.counts("alpha") == (1, 3)
    jobs.set_status(held[3], end)  # a job waiting behind frees its slot too
    assert jobs.admission.counts("alpha") == (1, 2)
    assert jobs.admission.admit("alpha", "next", CAPS) is Slot.FRONT
    assert jobs.admission.admit("alpha", "after", CAPS) is Slot.HELD


def test_a_job_without_a_tenant_or_never_admitted_ends_without_touching_slots(
    redis_client: redis.Redis,
) -> None:
    jobs = JobStore(redis_client, ttl_s=600)
    jobs.admission.admit("alpha", "other", CAPS)
    anonymous = jobs.create(REQUEST)
    item = jobs.create(REQUEST, tenant="alpha", batch="b1")  # batch items are not admitted
    jobs.set_status(anonymous, JobStatus.SUCCEEDED)
    jobs.set_status(item, JobStatus.SUCCEEDED)
    assert jobs.admission.counts("alpha") == (1, 0)


def test_a_slot_whose_job_never_ends_lapses_after_the_deadline_and_grace(
    redis_client: redis.Redis, clock: Clock
) -> None:
    """A job whose worker died and whose watchdog was lost too holds its slot only until
    `lapse_s` (the job deadline plus the grace) has passed."""
    gate = Admission(redis_client)
    for i in range(5):
        gate.admit("alpha", f"j{i}", CAPS)
    clock.now += CAPS.lapse_s - 1
    with pytest.raises(TooManyJobs):
        gate.admit("alpha", "late", CAPS)
    clock.now += 2
    assert gate.counts("alpha") == (0, 0)
    assert gate.admit("alpha", "late", CAPS) is Slot.FRONT
    ttl = redis_client.ttl("webctx:tenant:alpha:front")
    assert 0 < int(ttl) <= CAPS.lapse_s + 1  # type: ignore[arg-type]


def test_a_refused_submission_leaves_no_job_and_frees_its_idempotency_key(
    redis_client: redis.Redis,
) -> None:
    from webctx.admission_settings import AdmissionSettings
    from webctx.api.runtime import Caller, open_runtime, submit
    from webctx.jobs.admission import admission_caps
    from webctx.settings import Settings

    url = redis_client.connection_pool.connection_kwargs
    broker = f"redis://{url['host']}:{url['port']}/{url['db']}"
    settings = Settings(broker_url=broker, admission=AdmissionSettings(running=1, queued=0))
    with open_runtime(settings) as runtime:
        runtime.jobs.admission.admit("alpha", "older", admission_caps(settings))
        with pytest.raises(TooManyJobs, match="WEBCTX_ADMISSION__RUNNING=1"):
            submit(runtime, Caller("alpha"), REQUEST, idempotency_key="k1")
    assert not list(redis_client.scan_iter("webctx:job:*"))
    assert not list(redis_client.scan_iter("webctx:idem:*"))
    assert Admission(redis_client).counts("alpha") == (1, 0)
