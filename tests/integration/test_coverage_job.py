"""Coverage through real jobs (the local service, the loopback test web, the openai
client): a question the web does not answer is said to be missing in JSON, Markdown and
MCP text; two questions asked at once get a facet each, each with its own passages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import ROOT, clean_env, run_cli
from tests.testweb import LoopbackWeb
from webctx.models import Bundle

ABSENT = "Which Roman emperor ordered the building of the wall across northern Britain?"
COMPOUND = (
    "How do you keep a sourdough starter alive through the working week? "
    "How do migrating birds find their way?"
)
ARGS = ["--max-sources", "6", "--top-k", "20", "--token-budget", "800"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _research(env: dict[str, str], question: str, fmt: str) -> str:
    done = run_cli(env, "research", question, "--format", fmt, *ARGS)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_question_no_page_answers_is_insufficient_and_says_so(
    test_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = clean_env(**test_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    bundle = Bundle.model_validate_json(_research(env, ABSENT, "json"))
    assert bundle.coverage is not None
    assert bundle.coverage.sufficient is False
    [facet] = bundle.coverage.facets
    assert facet.status == "missing" and facet.text == ABSENT
    assert bundle.coverage.notes == [f"No source found for: {ABSENT}"]
    # The only facet: no other facet could use its share, so it keeps its passages.
    assert facet.chunks == list(range(len(bundle.chunks)))
    markdown = _research(env, ABSENT, "markdown")
    assert f"No source found for: {ABSENT}" in markdown
    assert "Coverage: insufficient" in markdown


@pytest.mark.anyio
async def test_mcp_text_says_what_no_source_was_found_for(
    test_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = clean_env(**test_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "webctx.cli", "mcp"], env=env, cwd=str(ROOT)
    )
    async with Client(params, read_timeout_seconds=120) as client:
        result = await client.call_tool("web_context", {"question": ABSENT, "max_sources": 6,
                                                        "wait_s": 110})  # fmt: skip
    assert not result.is_error, result.content
    assert f"No source found for: {ABSENT}" in result.content[0].text  # type: ignore[union-attr]
    assert result.structured_content["coverage"]["sufficient"] is False


def test_two_questions_at_once_get_a_facet_each_with_their_own_passages(
    test_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = clean_env(**test_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    bundle = Bundle.model_validate_json(_research(env, COMPOUND, "json"))
    assert bundle.coverage is not None
    starter, birds = bundle.coverage.facets
    assert starter.text.startswith("How do you keep a sourdough starter")
    assert birds.text == "How do migrating birds find their way?"
    assert starter.chunks and birds.chunks and not set(starter.chunks) & set(birds.chunks)
    urls = {s.id: s.url for s in bundle.sources}
    assert any("sourdough" in urls[bundle.chunks[i].source] for i in starter.chunks)
    assert any("bird" in urls[bundle.chunks[i].source] for i in birds.chunks)
    assert sorted(starter.chunks + birds.chunks) == list(range(len(bundle.chunks)))
    assert any("sourdough" in q for q in bundle.queries)
    assert any("birds" in q for q in bundle.queries)
