"""A job's facets come from its plan: plan_job stores the planner's (a chat model's, or the
rules') beside the queries, and rank and coverage use those, not a new split of the
question; the coverage judge runs at rank only when configured. The steps called
in-process on the test Redis, the chat model a loopback API behind the real client."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.chatweb import ChatScript, chat_server
from tests.conftest import redis_url
from tests.factories import make_page
from webctx.devweb.server import LoopbackServer
from webctx.jobs import steps
from webctx.jobs.engine import Engine
from webctx.models import Bundle, JobRequest, JobStatus
from webctx.settings import Settings
from webctx.stages.facets import split_facets
from webctx.stages.judge import UNSUPPORTED_CAP

QUESTION = "Who founded Acme Corp and when did it go public"
MakeEngine = Callable[..., Engine]
FACETS = ["Who founded Acme Corp?", "When did Acme Corp go public?"]
TEXT = (
    "Acme Corp was founded in 1901 by Jane Roe, a blacksmith from Ohio. "
    "The company went public in 1950, when its shares were first listed in New York."
)


@pytest.fixture(scope="module")
def chat() -> Iterator[tuple[LoopbackServer, ChatScript]]:
    with chat_server() as served:
        yield served


@pytest.fixture
def make_engine(tmp_path: Path, chat: tuple[LoopbackServer, ChatScript]) -> Iterator[MakeEngine]:
    from webctx.workers.deps import build_engine, stores_on

    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    chat[1].requests.clear()
    chat[1].answers.clear()

    def make(**settings: object) -> Engine:
        given = {"openai_base_url": f"{chat[0].url}/v1", **settings}
        config = Settings(redis_url=redis_url(), embedding_provider="hash",
                          qdrant_path=tmp_path / "q", prefilter={"when": "always"},
                          **given)  # type: ignore[arg-type]  # fmt: skip
        return build_engine(config, stores_on(client, config), state=client,
                            start=lambda stage, arguments: None)  # fmt: skip

    yield make
    client.flushdb()
    client.close()


def never_retry(exc: Exception) -> None:
    raise AssertionError(f"retried: {exc!r}")


def run_job(engine: Engine) -> Bundle:
    """Plan the job, give it one page, rank it: its bundle."""
    job_id = engine.jobs.create(JobRequest(question=QUESTION))
    steps.plan_job(engine, job_id)
    (url_id,) = engine.jobs.set_urls(job_id, ["https://example.org/acme"]).values()
    engine.jobs.save_page(job_id, url_id, make_page(url="https://example.org/acme", text=TEXT))
    steps.rank_job(engine, job_id, force=False, retry=never_retry)
    assert engine.jobs.status(job_id) is JobStatus.SUCCEEDED, engine.jobs.error(job_id)
    bundle = engine.jobs.bundle(job_id)
    assert bundle is not None and bundle.coverage is not None
    return bundle


def test_the_planners_facets_are_stored_and_reach_coverage(
    make_engine: MakeEngine, chat: tuple[LoopbackServer, ChatScript]
) -> None:
    chat[1].status, chat[1].delay_s = 200, 0.0
    chat[1].content = json.dumps({"queries": ["acme founder", "acme ipo"], "facets": FACETS})
    engine = make_engine(planner_model="planner-model")
    bundle = run_job(engine)
    assert split_facets(QUESTION) == [QUESTION]  # the rules would see one facet
    assert bundle.coverage is not None
    assert [f.text for f in bundle.coverage.facets] == FACETS
    assert bundle.queries == [QUESTION, "acme founder", "acme ipo"]
    assert bundle.stats.coverage_judge == ""  # no judge model: none asked
    assert [r["model"] for r in chat[1].requests] == ["planner-model"]


def test_the_rules_facets_are_stored_the_same_way(make_engine: MakeEngine) -> None:
    engine = make_engine()
    question = "Who founded Acme Corp? When did the company go public?"
    job_id = engine.jobs.create(JobRequest(question=question))
    steps.plan_job(engine, job_id)
    assert engine.jobs.queries(job_id, "facets") == split_facets(question)
    assert len(split_facets(question)) == 2


def test_a_job_planned_without_facets_gets_the_rules(make_engine: MakeEngine) -> None:
    engine = make_engine()
    job_id = engine.jobs.create(JobRequest(question=QUESTION))
    engine.jobs.set_queries(job_id, [QUESTION])  # as plans were stored before facets
    assert steps.planned_facets(engine, job_id) == [QUESTION]


def test_off_by_default_the_judge_sends_nothing(
    make_engine: MakeEngine, chat: tuple[LoopbackServer, ChatScript]
) -> None:
    engine = make_engine()
    assert engine.judge is None
    bundle = run_job(engine)
    assert chat[1].requests == [] and bundle.stats.coverage_judge == ""


def test_a_configured_judge_runs_at_rank(
    make_engine: MakeEngine, chat: tuple[LoopbackServer, ChatScript]
) -> None:
    chat[1].status, chat[1].delay_s = 200, 0.0
    chat[1].content = json.dumps({"supported": False, "passages": []})
    engine = make_engine(coverage={"judge_model": "judge-model"})
    bundle = run_job(engine)
    asked = [r for r in chat[1].requests if r["model"] == "judge-model"]
    assert len(asked) == 1 and asked[0]["response_format"] == {"type": "json_object"}
    assert bundle.stats.coverage_judge == "applied"
    assert bundle.coverage is not None
    assert bundle.coverage.facets[0].status != "supported"
    assert bundle.coverage.facets[0].confidence <= UNSUPPORTED_CAP


def test_a_judge_that_cannot_reach_its_model_leaves_the_job_its_numbers(
    make_engine: MakeEngine, chat: tuple[LoopbackServer, ChatScript]
) -> None:
    engine = make_engine(coverage={"judge_model": "judge-model"},
                         openai_base_url="not a url at all")  # fmt: skip
    bundle = run_job(engine)
    assert bundle.stats.coverage_judge == "skipped: the model was not reached: APIConnectionError"
    assert chat[1].requests == []


def test_a_judge_that_raises_leaves_the_job_its_numbers(make_engine: MakeEngine) -> None:
    def broken(bundle: Bundle) -> None:
        raise RuntimeError("no client")

    engine = dataclasses.replace(make_engine(), judge=broken)
    bundle = run_job(engine)
    assert bundle.stats.coverage_judge == "skipped: error: RuntimeError"
    assert bundle.coverage is not None
    assert (
        bundle.coverage.notes[-1]
        == "Coverage judge skipped (error: RuntimeError): the numbers stand."
    )
