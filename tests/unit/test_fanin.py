"""The job engine's fan-in: each stage starts once, when its set fills (fakeredis)."""

from __future__ import annotations

from collections.abc import Sequence

import fakeredis
import pytest

from webctx.jobs.fanin import FanIn
from webctx.jobs.store import JobStore
from webctx.models import JobRequest, JobStatus, SearchResult


class Started:
    """A recording `start`: every stage's argument tuples, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[str | int, ...]]]] = []

    def __call__(self, stage: str, arguments: Sequence[tuple[str | int, ...]]) -> None:
        self.calls.append((stage, list(arguments)))

    def stages(self) -> list[str]:
        return [stage for stage, _ in self.calls]


@pytest.fixture
def jobs() -> JobStore:
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=60)


def _result(url: str) -> SearchResult:
    return SearchResult(url=url, title="t", rank=0, query="q")


def test_planning_starts_the_question_ahead_and_one_search_per_query(jobs: JobStore) -> None:
    started = Started()
    job = jobs.create(JobRequest(question="q"))
    FanIn(jobs, started).planned(job, queries=3, question_ahead=True)
    assert started.calls == [("embed_question", [(job,)]),
                             ("search", [(job, 0), (job, 1), (job, 2)])]  # fmt: skip
    FanIn(jobs, started := Started()).planned(job, queries=1, question_ahead=False)
    assert started.stages() == ["search"]


def test_the_last_search_chooses_the_urls_and_starts_their_fetches_once(jobs: JobStore) -> None:
    started = Started()
    fanin = FanIn(jobs, started)
    job = jobs.create(JobRequest(question="q", max_sources=2))
    jobs.set_queries(job, ["a", "b"])
    jobs.save_search(job, 0, [_result("https://a.test/1"), _result("https://a.test/2")])
    fanin.searched(job, 0)
    assert started.calls == []
    jobs.save_search(job, 1, [_result("https://b.test/1")])
    fanin.searched(job, 1)
    (stage, fetches), = started.calls
    assert stage == "fetch" and len(fetches) == 2  # the best max_sources of three
    assert set(jobs.urls(job).values()) <= {"https://a.test/1", "https://a.test/2",
                                            "https://b.test/1"}  # fmt: skip
    fanin.searched(job, 1)  # a redelivered search, its next stage recorded as started
    assert started.stages() == ["fetch"]


def test_the_chosen_urls_are_readied_before_their_fetches_start(jobs: JobStore) -> None:
    order: list[object] = []
    fanin = FanIn(jobs, lambda stage, args: order.append(stage),
                  warm=lambda urls: order.append(sorted(urls)))  # fmt: skip
    job = jobs.create(JobRequest(question="q", max_sources=1))
    jobs.set_queries(job, ["a"])
    jobs.save_search(job, 0, [_result("https://a.test/1")])
    fanin.searched(job, 0)
    assert order == [["https://a.test/1"], "fetch"]


def test_no_result_at_all_fails_the_job_with_the_reason(jobs: JobStore) -> None:
    started = Started()
    job = jobs.create(JobRequest(question="q"))
    jobs.set_queries(job, ["a"])
    jobs.save_search(job, 0, [])
    FanIn(jobs, started).searched(job, 0)
    assert started.calls == [] and jobs.status(job) is JobStatus.FAILED
    assert jobs.error(job) == "search returned no results"


def test_the_last_settled_page_starts_rank_and_a_lost_start_is_restarted(jobs: JobStore) -> None:
    started = Started()
    fanin = FanIn(jobs, started)
    job = jobs.create(JobRequest(question="q"))
    url_ids = list(jobs.set_urls(job, ["https://a.test/", "https://b.test/"]))
    fanin.settled(job, url_ids[0])
    assert started.calls == []
    # The rank start is sent but its starter dies before recording it: a redelivery of
    # the same settle starts it again.
    jobs.complete(job, "embed", url_ids[1], total=2)
    fanin.settled(job, url_ids[1])
    assert started.calls == [("rank", [(job,)])]
    fanin.settled(job, url_ids[1])
    assert started.stages() == ["rank"]
