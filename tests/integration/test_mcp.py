"""The MCP server through the SDK's own client: over stdio (`webctx mcp`, through the
local service) and over streamable HTTP (/mcp of the API app, API keys), against loopback
webs; and through the clients people use: the TypeScript SDK (what Claude Code and Cursor build
on) and the MCP Inspector's CLI, installed by scripts/mcp-clients (skipped without them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import ROOT, clean_env, redis_url
from tests.integration.conftest import ApiStack, NodeClients
from tests.rawmcp import RawHttp, poll
from tests.sdk_tasks import TasksClient
from tests.testweb import LoopbackWeb
from webctx.api.routes.oauth import NO_OAUTH
from webctx.knobs import default
from webctx.models import Bundle

# One xdist worker runs this module: one API stack for its HTTP test, and the rest.
pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("mcp_stack")]
QUESTION = "how do lithium-ion batteries degrade?"
TOOLS = {"web_context", "web_context_batch", "get_job", "get_source", "search_index"}
# A loaded machine may need more than the default wait (WEBCTX_MCP_WAIT_S, 50 s) for a job.
ARGS = {"question": QUESTION, "max_sources": 4, "top_k": 5, "token_budget": 800, "wait_s": 110}
TASK_ARGS = {k: v for k, v in ARGS.items() if k != "wait_s"}  # a task does not wait


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _http_client(stack: ApiStack, token: str | None, **options: Any) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120))
    return Client(streamable_http_client(f"{stack.url}/mcp", http_client=http), **options)


def _task_records() -> int:
    """Task records in the stack's Redis (webctx/jobs/task_records.py)."""
    client = redis.Redis.from_url(redis_url())
    try:
        return sum(1 for _ in client.scan_iter("webctx:task:*"))
    finally:
        client.close()


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
        assert set(tools) == TOOLS
        schema = tools["web_context"].input_schema
        assert schema["required"] == ["question"]
        # The job knobs' one table: the same range and default as the HTTP API's.
        assert schema["properties"]["max_sources"]["maximum"] == 100
        assert schema["properties"]["max_sources"]["default"] == default("max_sources")
        assert {"max_age", "stale_if_error"} <= set(schema["properties"])
        assert tools["web_context"].output_schema is not None
        result = await client.call_tool("web_context", ARGS, progress_callback=on_progress)
        bundle = _check_bundle_result(result, api_stack.web)
        assert progress and progress == sorted(progress)
        assert all(s.retrieved and s.checked_at for s in bundle.sources)

        source = await client.call_tool("get_source", {"ref": bundle.sources[0].url})
        assert not source.is_error
        assert source.structured_content["content_sha256"] == bundle.sources[0].content_sha256
        chunk = next(c for c in bundle.chunks if c.source == bundle.sources[0].id)
        assert chunk.text in source.structured_content["text"]

        bad = await client.call_tool("web_context", {**ARGS, "max_sources": 0})
        said = bad.content[0].text  # type: ignore[union-attr]
        assert bad.is_error and "max_sources must be between 1 and 100 (got 0)" in said
        assert "pydantic" not in said
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


async def test_mcp_over_stdio_answers_through_the_local_service(
    test_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = clean_env(**test_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "webctx.cli", "mcp"], env=env, cwd=str(ROOT)
    )
    async with Client(params, read_timeout_seconds=120) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == TOOLS
        result = await client.call_tool("web_context", {**ARGS, "max_sources": 6})
        _check_bundle_result(result, test_web)


async def test_mcp_over_http_without_a_key_offers_no_oauth_and_says_why(
    api_stack: ApiStack,
) -> None:
    """What an OAuth-capable client probes after a 401 (docs/api.md): no resource_metadata
    to follow, and every discovery or registration URL answers 404 with the reason."""
    resp = httpx2.post(f"{api_stack.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert resp.status_code == 401
    assert "resource_metadata" not in resp.headers["www-authenticate"]
    probes = [("GET", f"/.well-known/{kind}{suffix}")
              for kind in ("oauth-protected-resource", "oauth-authorization-server",
                           "openid-configuration") for suffix in ("", "/mcp")]  # fmt: skip
    for method, path in [*probes, ("POST", "/register")]:
        answer = httpx2.request(method, api_stack.url + path, json={})
        assert answer.status_code == 404, path
        assert answer.json() == {"error": "not_found", "error_description": NO_OAUTH}, path


async def test_mcp_over_http_hands_back_a_running_job_and_get_job_finishes_it(
    api_stack: ApiStack,
) -> None:
    async with _http_client(api_stack, api_stack.keys["alpha"]) as client:
        started = await client.call_tool("web_context", {**ARGS, "wait_s": 0})
        assert not started.is_error, started.content
        job = started.structured_content or {}
        assert job["status"] in ("queued", "running") and job["chunks"] == []
        assert "get_job" in started.content[0].text  # type: ignore[union-attr]
        finished = await client.call_tool("get_job", {"job_id": job["job_id"], "wait_s": 90})
        _check_bundle_result(finished, api_stack.web)
    async with _http_client(api_stack, api_stack.keys["beta"]) as other:
        theirs = await other.call_tool("get_job", {"job_id": job["job_id"], "wait_s": 0})
        assert theirs.is_error


async def test_mcp_tasks_over_http_belong_to_the_key_that_made_them(api_stack: ApiStack) -> None:
    url = f"{api_stack.url}/mcp"
    alpha = RawHttp(url, key=api_stack.keys["alpha"])
    beta = RawHttp(url, key=api_stack.keys["beta"])
    created = alpha.request("tools/call", {"name": "web_context", "arguments": TASK_ARGS})
    task_id = created["result"]["taskId"]
    assert created["result"]["resultType"] == "task"
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        theirs = beta.request(method, {"taskId": task_id, "inputResponses": {}})
        assert theirs["error"]["code"] == -32602, (method, theirs)  # as if it did not exist
    keyless = RawHttp(url, key=None).request("tasks/get", {"taskId": task_id})
    assert keyless["error"] == "unauthorized"  # the 401 of every /mcp request without a key
    done = poll(alpha, task_id)[-1]  # beta's cancel changed nothing
    assert done["status"] == "completed", done
    bundle = Bundle.model_validate(done["result"]["structuredContent"])
    assert bundle.chunks and all(s.url.startswith(api_stack.web.site.url) for s in bundle.sources)


async def test_python_sdk_with_the_tasks_extension_gets_the_tasks_result(
    api_stack: ApiStack,
) -> None:
    tasks = TasksClient()
    async with _http_client(api_stack, api_stack.keys["alpha"], extensions=[tasks]) as client:
        assert client.protocol_version == "2026-07-28"
        result = await client.call_tool("web_context", TASK_ARGS)
    _check_bundle_result(result, api_stack.web)
    assert len(tasks.created) == 1 and tasks.seen[-1]["status"] == "completed"
    assert all(task["statusMessage"] for task in tasks.seen)


async def test_typescript_sdk_client_shows_why_without_a_key_and_works_with_one(
    api_stack: ApiStack, node_clients: NodeClients
) -> None:
    script = ROOT / "tests" / "node" / "ts_client.cjs"
    done = node_clients.run(str(script), f"{api_stack.url}/mcp", api_stack.keys["alpha"])
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    # A client without OAuth shows the 401's message; one with OAuth (Claude Code, Cursor)
    # goes through discovery and registration, and shows the registration's answer.
    assert "missing API key" in seen["plain"]
    assert seen["oauth"] == NO_OAUTH
    assert seen["server"] == {"name": "webctx", "version": "0.1.0"}
    hints = {"readOnlyHint": True, "openWorldHint": True, "idempotentHint": True}
    assert all(t["annotations"] == hints for t in seen["tools"]), seen["tools"]
    # The SDK checks structured content against the output schema, a running job's too.
    assert seen["started"]["status"] in ("queued", "running")
    finished = seen["finished"]
    assert not finished["isError"] and finished["status"] == "succeeded" and finished["chunks"]


async def test_inspector_cli_shows_why_without_a_key_and_lists_tools_with_one(
    api_stack: ApiStack, node_clients: NodeClients
) -> None:
    url = f"{api_stack.url}/mcp"
    # It treats any 401 as "log in": non-interactively it refuses and quotes the 401...
    stored_only = node_clients.inspector(url, "--method", "tools/list", "--stored-auth-only")
    assert "missing API key" in stored_only.stderr, stored_only.stderr
    # ...and where it may log in, it ends at the registration and quotes its answer.
    oauth = node_clients.inspector(url, "--method", "tools/list", MCP_AUTO_OPEN_ENABLED="true",
                                   BROWSER="true")  # fmt: skip
    assert "webctx takes API keys, not OAuth" in oauth.stderr, oauth.stderr
    header = f"Authorization: Bearer {api_stack.keys['alpha']}"
    listed = node_clients.inspector(url, "--method", "tools/list", "--header", header)
    assert listed.returncode == 0, listed.stderr[-3000:]
    names = {t["name"] for t in json.loads(listed.stdout)["tools"]}
    assert names == TOOLS


async def test_typescript_ext_tasks_client_completes_and_cancels_a_task(
    api_stack: ApiStack, node_clients: NodeClients
) -> None:
    script = ROOT / "tests" / "node" / "ts_tasks.mjs"
    done = node_clients.run(str(script), f"{api_stack.url}/mcp", api_stack.keys["alpha"])
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["era"] == "modern" and seen["execution"] is True
    assert seen["kind"] == "task" and seen["status"] == "completed", seen
    assert not seen["isError"] and seen["chunks"] > 0
    assert seen["messages"] and "passages from" in seen["messages"][-1]
    assert seen["second"]["kind"] == "task" and seen["second"]["after"] == "cancelled"


async def test_inspector_cli_runs_web_context_as_a_task_in_the_2026_era_only(
    api_stack: ApiStack, node_clients: NodeClients
) -> None:
    url, header = f"{api_stack.url}/mcp", f"Authorization: Bearer {api_stack.keys['alpha']}"
    call = ["--method", "tools/call", "--tool-name", "web_context",
            "--tool-args-json", json.dumps(TASK_ARGS), "--format", "json"]  # fmt: skip
    for era, new_tasks in (("modern", 1), ("legacy", 0)):
        before = _task_records()
        done = node_clients.inspector(url, "--header", header, "--protocol-era", era, *call)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)["result"]
        assert not result["isError"], result
        if new_tasks:  # the task's result, polled to the end; a legacy call waits instead
            assert result["structuredContent"]["status"] == "succeeded"
            assert result["structuredContent"]["chunks"]
        assert _task_records() - before == new_tasks, era
