"""A deep job's round records in the job store: a round begins once however often its
rank is redelivered, its URLs join the job's without replacing them, and a new round's
fan-ins can start their next stage again."""

from __future__ import annotations

import fakeredis
import pytest

from webctx.jobs.round_store import RoundRecord
from webctx.jobs.store import JobStore, url_id_for
from webctx.models import JobRequest


@pytest.fixture
def jobs() -> JobStore:
    return JobStore(fakeredis.FakeRedis(decode_responses=True))


def test_a_round_begins_once_and_its_records_come_back_in_order(jobs: JobStore) -> None:
    job_id = jobs.create(JobRequest(question="q", depth="deep"))
    assert jobs.rounds.latest(job_id) is None
    assert jobs.rounds.begin(job_id, RoundRecord(round=1, started_at=1.0, pages=3))
    assert jobs.rounds.begin(job_id, RoundRecord(round=2, started_at=2.0, queries=["a"]))
    assert not jobs.rounds.begin(job_id, RoundRecord(round=2, started_at=3.0))  # redelivered
    second = jobs.rounds.latest(job_id)
    assert second is not None and second.started_at == 2.0 and second.queries == ["a"]
    second.pages, second.seconds = 4, 1.5
    jobs.rounds.save(job_id, second)
    assert [(r.round, r.pages) for r in jobs.rounds.records(job_id)] == [(1, 3), (2, 4)]


def test_a_rounds_urls_join_the_jobs_and_a_known_one_is_not_added_again(jobs: JobStore) -> None:
    job_id = jobs.create(JobRequest(question="q", depth="deep"))
    jobs.set_urls(job_id, ["https://a.example/1", "https://a.example/2"])
    added = jobs.rounds.add_urls(job_id, ["https://a.example/2", "https://a.example/3"], url_id_for)
    assert added == [url_id_for("https://a.example/3")]
    assert sorted(jobs.urls(job_id).values()) == [f"https://a.example/{i}" for i in (1, 2, 3)]
    assert jobs.rounds.add_urls(job_id, ["https://a.example/3"], url_id_for) == []


def test_a_new_round_lets_its_last_search_and_last_page_start_the_next_stage(
    jobs: JobStore,
) -> None:
    job_id = jobs.create(JobRequest(question="q", depth="deep"))
    jobs.set_queries(job_id, ["a"])
    assert jobs.complete(job_id, "search", "0", total=1)
    jobs.mark_next_started(job_id, "search")
    jobs.set_queries(job_id, ["a", "b"])
    jobs.rounds.restart_fanins(job_id)
    assert not jobs.complete(job_id, "search", "0", total=2)  # round 1's, redelivered
    assert jobs.complete(job_id, "search", "1", total=2)  # round 2's last search
    assert jobs.complete(job_id, "search", "1", total=2)  # its starter died: again
    jobs.mark_next_started(job_id, "search")
    assert not jobs.complete(job_id, "search", "1", total=2)
