"""Query planning: the rule-based planner and LLMPlanner against a loopback chat API."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from webctx.devweb.server import LoopbackServer
from webctx.stages.plan import LLMPlanner, parse_query_list, plan_queries

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


@dataclass
class ChatScript:
    """What the loopback chat API answers next, and what it was asked."""

    content: str = "[]"
    status: int = 200
    requests: list[dict[str, object]] = field(default_factory=list)


@pytest.fixture(scope="module")
def chat() -> Iterator[tuple[LoopbackServer, ChatScript]]:
    script = ChatScript()

    async def completions(request: Request) -> Response:
        body = await request.json()
        script.requests.append(body)
        if script.status != 200:
            error = {"message": "boom", "type": "server_error", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=script.status)
        message = {"role": "assistant", "content": script.content}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        usage = {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
        return JSONResponse(
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [choice],
                "usage": usage,
            }
        )

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    with LoopbackServer(app) as server:
        yield server, script


def planner(server: LoopbackServer) -> LLMPlanner:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0)
    return LLMPlanner(client, "planner-model")


def test_llm_planner_puts_question_first_then_model_queries(
    chat: tuple[LoopbackServer, ChatScript],
) -> None:
    server, script = chat
    script.status, script.content = 200, '["celery retry backoff", "Celery Retry Backoff", "x"]'
    queries = planner(server).plan(QUESTION, 3)
    assert queries == [QUESTION, "celery retry backoff", "x"]
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
        queries = planner(server).plan(QUESTION, 3)
    assert queries == plan_queries(QUESTION, max_queries=3)
    assert "llm planner failed" in caplog.text
