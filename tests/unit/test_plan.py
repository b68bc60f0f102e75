"""Query planning: the rule-based planner and LLMPlanner against a loopback chat API."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import openai
import pytest

from tests.chatweb import ChatScript, chat_server
from webctx.devweb.server import LoopbackServer
from webctx.stages.facets import split_facets
from webctx.stages.plan import (
    MAX_FACET_CHARS,
    MAX_FACETS,
    LLMPlanner,
    parse_facets,
    parse_query_list,
    plan_queries,
    plan_question,
)

QUESTION = "How does Celery handle task retries when Redis restarts?"


def test_question_comes_first_then_keyword_and_entity_variants() -> None:
    queries = plan_queries(
        "How does Celery handle task retries when Redis restarts?", max_queries=4
    )
    assert queries[0] == "How does Celery handle task retries when Redis restarts?"
    assert queries[1] == "Celery handle task retries Redis restarts"
    assert any(q.startswith("Celery Redis") for q in queries[2:])


def test_quoted_phrases_and_multiword_entities_are_kept_whole() -> None:
    queries = plan_queries(
        'What is the "visibility timeout" of the Large Hadron Collider?', max_queries=5
    )
    assert '"visibility timeout" Large Hadron Collider' in queries
    assert any('"Large Hadron Collider"' in q for q in queries)


def test_technical_tokens_survive() -> None:
    keywords = plan_queries("Is C++ faster than Node.js for I/O with GPT-4?", max_queries=2)[1]
    assert keywords == "C++ faster Node.js I/O GPT-4"


def test_comparison_gets_one_query_per_entity() -> None:
    queries = plan_queries("Compare PostgreSQL and MySQL replication", max_queries=10)
    assert "PostgreSQL replication" in queries and "MySQL replication" in queries


@pytest.mark.parametrize("max_queries", [1, 2, 3])
def test_respects_max_queries_and_dedupes_case_insensitively(max_queries: int) -> None:
    queries = plan_queries("Python asyncio tutorial", max_queries=max_queries)
    assert 1 <= len(queries) <= max_queries
    assert len({q.casefold() for q in queries}) == len(queries)


def test_question_of_only_stopwords_is_returned_alone() -> None:
    assert plan_queries("  what   is it? ", max_queries=4) == ["what is it?"]


@pytest.mark.parametrize(
    "content",
    [
        '["celery retries", "redis aof"]',
        '```json\n["celery retries", "redis aof"]\n```',
        '{"queries": ["celery retries", "redis aof"]}',
        'Here you go: ["celery retries", "redis aof"] hope it helps',
        "1. celery retries\n2. redis aof",
        "- celery retries\n- redis aof",
    ],
)
def test_parse_query_list_is_lenient(content: str) -> None:
    assert parse_query_list(content) == ["celery retries", "redis aof"]


@pytest.fixture(scope="module")
def chat() -> Iterator[tuple[LoopbackServer, ChatScript]]:
    with chat_server() as served:
        yield served


def planner(server: LoopbackServer) -> LLMPlanner:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0)
    return LLMPlanner(client, "planner-model")


def test_llm_planner_puts_question_first_then_model_queries(
    chat: tuple[LoopbackServer, ChatScript],
) -> None:
    server, script = chat
    script.status, script.content = 200, '["celery retry backoff", "Celery Retry Backoff", "x"]'
    plan = planner(server).plan(QUESTION, 3)
    assert plan.queries == [QUESTION, "celery retry backoff", "x"]
    assert script.requests[-1]["model"] == "planner-model"


@pytest.mark.parametrize(("status", "content"), [(200, "I cannot help with that."), (500, "")])
def test_llm_planner_falls_back_to_rules_and_logs(
    chat: tuple[LoopbackServer, ChatScript],
    caplog: pytest.LogCaptureFixture,
    status: int,
    content: str,
) -> None:
    server, script = chat
    script.status, script.content = status, content
    with caplog.at_level(logging.WARNING, logger="webctx.stages.plan"):
        plan = planner(server).plan(QUESTION, 3)
    assert plan == plan_question(QUESTION, max_queries=3)
    assert "llm planner failed" in caplog.text


TWO_PART = "Who founded Acme Corp and when did it go public"
"""Asked without a mark between its parts: the rules see one facet, a model two."""


def test_llm_planner_returns_the_models_facets(chat: tuple[LoopbackServer, ChatScript]) -> None:
    server, script = chat
    facets = ["Who founded Acme Corp?", "When did Acme Corp go public?"]
    script.status = 200
    script.content = json.dumps({"queries": ["acme founder", "acme ipo"],
                                 "facets": [*facets, " who founded  acme corp? "]})  # fmt: skip
    plan = planner(server).plan(TWO_PART, 3)
    assert split_facets(TWO_PART) == [TWO_PART]
    assert plan.facets == facets
    assert plan.queries == [TWO_PART, "acme founder", "acme ipo"]
    system = script.requests[-1]["messages"][0]["content"]  # type: ignore[index]
    assert '"facets"' in system


def test_llm_planner_one_facet_is_the_question(chat: tuple[LoopbackServer, ChatScript]) -> None:
    server, script = chat
    script.status = 200
    script.content = '{"queries": ["celery retries"], "facets": ["Celery retries on restart?"]}'
    assert planner(server).plan(f"  {QUESTION} ", 3).facets == [QUESTION]


@pytest.mark.parametrize(
    "facets",
    [None, [], "one string", ["ok", ""], ["ok", 3], ["x" * (MAX_FACET_CHARS + 1)],
     [f"part {n}?" for n in range(MAX_FACETS + 1)]],
)  # fmt: skip
def test_llm_planner_without_valid_facets_keeps_its_queries_and_splits_by_rule(
    chat: tuple[LoopbackServer, ChatScript],
    caplog: pytest.LogCaptureFixture,
    facets: object,
) -> None:
    server, script = chat
    question = "Who founded Acme Corp? When did the company go public?"
    answer: dict[str, object] = {"queries": ["acme founder"]}
    if facets is not None:
        answer["facets"] = facets
    script.status, script.content = 200, json.dumps(answer)
    with caplog.at_level(logging.WARNING, logger="webctx.stages.plan"):
        plan = planner(server).plan(question, 3)
    assert plan.queries == [question, "acme founder"]
    assert plan.facets == split_facets(question) and len(plan.facets) == 2
    assert "no valid facets" in caplog.text


def test_parse_facets_reads_a_fenced_object() -> None:
    content = '```json\n{"queries": ["a"], "facets": ["What is A?", "What is B?"]}\n```'
    assert parse_facets(content) == ["What is A?", "What is B?"]
    assert parse_query_list(content) == ["a"]
    assert parse_facets('["a", "b"]') is None
