"""The MCP server through the SDK's own client: over stdio (`webctx mcp`, embedded
worker) and over streamable HTTP (/mcp of the API app, API keys), against loopback webs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import ROOT, clean_env
from tests.integration.conftest import ApiStack
from tests.testweb import LoopbackWeb
from webctx.models import Bundle

# One xdist worker runs this module: one API stack for its HTTP test, and the rest.
pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("mcp_stack")]
QUESTION = "how do lithium-ion batteries degrade?"
ARGS = {"question": QUESTION, "max_sources": 4, "top_k": 5, "token_budget": 800}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _http_client(stack: ApiStack, token: str | None) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120))
    return Client(streamable_http_client(f"{stack.url}/mcp", http_client=http))


def _check_bundle_result(result: Any, web: LoopbackWeb) -> Bundle:
    assert not result.is_error, result.content
    bundle = Bundle.model_validate(result.structured_content)
    assert bundle.chunks and bundle.sources
    assert all(s.url.startswith(web.site.url) for s in bundle.sources)
    text = result.content[0].text
    assert QUESTION in text and "[1]" in text
    return bundle


async def test_mcp_over_streamable_http_lists_tools_and_answers(api_stack: ApiStack) -> None:
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with _http_client(api_stack, api_stack.keys["alpha"]) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"web_context", "get_job", "get_source", "search_index"}
        schema = tools["web_context"].input_schema
        assert schema["required"] == ["question"]
        assert schema["properties"]["max_sources"]["maximum"] == 50
        assert tools["web_context"].output_schema is not None
        result = await client.call_tool("web_context", ARGS, progress_callback=on_progress)
        bundle = _check_bundle_result(result, api_stack.web)
        assert progress and progress == sorted(progress)

        source = await client.call_tool("get_source", {"ref": bundle.sources[0].url})
        assert not source.is_error
        assert source.structured_content["content_sha256"] == bundle.sources[0].content_sha256
        chunk = next(c for c in bundle.chunks if c.source == bundle.sources[0].id)
        assert chunk.text in source.structured_content["text"]

        bad = await client.call_tool("web_context", {**ARGS, "max_sources": 0})
        assert bad.is_error and "max_sources" in bad.content[0].text
        missing = await client.call_tool("get_source", {"ref": "http://nowhere.invalid/"})
        assert missing.is_error and "no stored source" in missing.content[0].text

    async with _http_client(api_stack, api_stack.keys["beta"]) as other:
        # Another tenant cannot read alpha's stored sources.
        theirs = await other.call_tool("get_source", {"ref": bundle.sources[0].content_sha256})
        assert theirs.is_error


@pytest.mark.parametrize("token", [None, "wctx_not-a-key"])
async def test_mcp_over_http_refuses_missing_or_bad_keys(
    api_stack: ApiStack, token: str | None
) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = httpx2.post(
        f"{api_stack.url}/mcp",
        headers={**headers, "Accept": "application/json, text/event-stream"},
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    )
    assert resp.status_code == 401 and resp.json()["error"] == "unauthorized"


async def test_mcp_over_stdio_answers_with_the_embedded_worker(
    test_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = clean_env(**test_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "webctx.cli", "mcp"], env=env, cwd=str(ROOT)
    )
    async with Client(params, read_timeout_seconds=120) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"web_context", "get_job", "get_source", "search_index"}
        result = await client.call_tool("web_context", {**ARGS, "max_sources": 6})
        _check_bundle_result(result, test_web)
