"""The tasks extension in-process, through the SDK's client, over the real job store: what
`tasks/get` says of a job at each step (this test plays the workers' part), what cancel
does to the job, and who may ask. tests/integration/test_mcp_tasks.py drives real
servers, workers and clients over stdio and HTTP."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.conftest import redis_url
from tests.factories import make_page
from tests.sdk_tasks import TASKS, TaskRequest, TasksClient
from webctx.api.mcp import build_mcp
from webctx.api.runtime import Runtime
from webctx.models import Bundle, BundleChunk, BundleSource, JobRequest, JobStatus
from webctx.settings import Settings
from webctx.workers.deps import stores_on

pytestmark = pytest.mark.anyio
TENANT = "local"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    client.flushdb()
    settings = Settings(redis_url=redis_url(), local_tenant=TENANT, api_auth="disabled")
    yield Runtime(settings, stores_on(client, settings))
    client.flushdb()
    client.close()


async def _ask(client: Client, method: str, task_id: str, **params: Any) -> dict[str, Any]:
    from pydantic import TypeAdapter

    request = TaskRequest(method=method, params={"taskId": task_id, **params})
    return await client.session.send_request(request, TypeAdapter(dict[str, Any]))


def _task(runtime: Runtime, tenant: str = TENANT) -> tuple[str, str]:
    job_id = runtime.jobs.create(JobRequest(question="q", max_sources=2), tenant=tenant)
    record = runtime.stores.tasks.create(tenant=tenant, kind="job", target=job_id,
                                         tool="web_context")  # fmt: skip
    return job_id, record.task_id


def _unfenced(text: str) -> str:
    return re.sub(r"webctx-untrusted [0-9a-f]+", "webctx-untrusted N", text)


def _bundle(job_id: str) -> Bundle:
    page = make_page()
    source = BundleSource(id=1, url=page.url, final_url=page.final_url, title=page.title,
                          site=page.site, published=None, fetched_at=page.fetched_at,
                          content_sha256=page.content_sha256)  # fmt: skip
    chunk = BundleChunk(source=1, text=page.text[:20], start=0, end=20, tokens=4, score=1)
    return Bundle(job_id=job_id, question="q", queries=["a"], sources=[source], chunks=[chunk])


async def test_tasks_get_follows_the_job_and_then_carries_the_tools_result(
    runtime: Runtime,
) -> None:
    jobs = runtime.jobs
    job_id, task_id = _task(runtime)
    page = make_page()
    async with Client(build_mcp(lambda: runtime), extensions=[TasksClient()]) as client:
        queued = await _ask(client, "tasks/get", task_id)
        jobs.set_status(job_id, JobStatus.RUNNING)
        jobs.set_queries(job_id, ["a"])
        jobs.complete(job_id, "search", "0", total=1)
        jobs.set_urls(job_id, [page.url, page.url + "?2"])
        jobs.save_page(job_id, "u0", page)
        running = await _ask(client, "tasks/get", task_id)
        jobs.save_bundle(job_id, _bundle(job_id))
        jobs.set_status(job_id, JobStatus.SUCCEEDED)
        done = await _ask(client, "tasks/get", task_id)
        plain = await client.call_tool("get_job", {"job_id": job_id, "wait_s": 0})
    assert queued["status"] == "working" and queued["statusMessage"].startswith("queued")
    assert queued["resultType"] == "complete" and queued["taskId"] == task_id
    assert queued["ttlMs"] == runtime.settings.job_ttl_s * 1000 and queued["pollIntervalMs"] > 0
    assert running["status"] == "working"
    assert "searched 1/1 queries, fetched 1/2 pages" in running["statusMessage"]
    assert done["status"] == "completed" and done["statusMessage"] == "1 passage from 1 source"
    assert done["createdAt"] == queued["createdAt"] <= done["lastUpdatedAt"]
    result = done["result"]
    assert result["isError"] is False
    assert result["structuredContent"] == plain.structured_content
    # The same text, but for the fence's nonce (fresh on every rendering).
    assert _unfenced(result["content"][0]["text"]) == _unfenced(plain.content[0].text)  # type: ignore[union-attr]


async def test_a_failed_job_is_a_completed_task_whose_result_is_a_tool_error(
    runtime: Runtime,
) -> None:
    job_id, task_id = _task(runtime)
    runtime.jobs.set_status(job_id, JobStatus.FAILED, error="all 2 sources failed: 404, 404")
    async with Client(build_mcp(lambda: runtime), extensions=[TasksClient()]) as client:
        done = await _ask(client, "tasks/get", task_id)
    assert done["status"] == "completed" and "error" not in done
    assert done["result"]["isError"] is True
    assert "all 2 sources failed" in done["result"]["content"][0]["text"]


async def test_tasks_cancel_cancels_the_job_and_the_task_ends_cancelled(runtime: Runtime) -> None:
    job_id, task_id = _task(runtime)
    async with Client(build_mcp(lambda: runtime), extensions=[TasksClient()]) as client:
        ack = await _ask(client, "tasks/cancel", task_id)
        assert runtime.jobs.status(job_id) is JobStatus.CANCELLED
        assert not runtime.jobs.is_active(job_id)  # its tasks return without working
        after = await _ask(client, "tasks/get", task_id)
        again = await _ask(client, "tasks/cancel", task_id)  # a finished task: still an ack
    assert ack == again == {"resultType": "complete", "_meta": ack["_meta"]}
    assert after["status"] == "cancelled" and "result" not in after
    assert "tasks/cancel" in after["statusMessage"]


async def test_a_task_whose_job_state_is_gone_has_failed_with_a_json_rpc_error(
    runtime: Runtime, redis_client: redis.Redis
) -> None:
    job_id, task_id = _task(runtime)
    redis_client.delete(f"webctx:job:{job_id}:meta")  # expired, or a state store wiped
    async with Client(build_mcp(lambda: runtime), extensions=[TasksClient()]) as client:
        gone = await _ask(client, "tasks/get", task_id)
    assert gone["status"] == "failed" and gone["error"]["code"] == -32603
    assert "state is gone" in gone["statusMessage"]


async def test_tasks_methods_answer_only_a_declaring_client_about_its_own_tasks(
    runtime: Runtime,
) -> None:
    _, task_id = _task(runtime)
    _, theirs = _task(runtime, tenant="someone-else")
    async with Client(build_mcp(lambda: runtime), extensions=[TasksClient()]) as client:
        for method in ("tasks/get", "tasks/cancel", "tasks/update"):
            for unknown in ("no-such-task", theirs, "x" * 5000):
                with pytest.raises(MCPError) as refused:
                    await _ask(client, method, unknown)
                assert refused.value.code == -32602, (method, refused.value)
        update = await _ask(client, "tasks/update", task_id, inputResponses={"k": {}})
        with pytest.raises(MCPError) as gone:
            await _ask(client, "tasks/result", task_id)  # removed from the extension
    assert update["resultType"] == "complete"
    assert gone.value.code == -32601
    async with Client(build_mcp(lambda: runtime)) as plain:  # no extension declared
        for method in ("tasks/get", "tasks/cancel", "tasks/update"):
            with pytest.raises(MCPError) as missing:
                await _ask(plain, method, task_id)
            assert missing.value.code == -32021
            assert missing.value.data == {"requiredCapabilities": {"extensions": {TASKS: {}}}}


async def test_a_2025_session_is_offered_no_tasks_and_no_prompts(runtime: Runtime) -> None:
    _, task_id = _task(runtime)
    server = build_mcp(lambda: runtime)
    async with Client(server, extensions=[TasksClient()]) as modern:
        discovered = modern.session.discover_result
        assert discovered is not None
        assert discovered.capabilities.extensions == {TASKS: {}}
        assert discovered.capabilities.prompts is None and discovered.capabilities.resources
        with pytest.raises(MCPError) as no_prompts:
            await modern.list_prompts()
    assert no_prompts.value.code == -32601
    async with Client(server, mode="legacy", extensions=[TasksClient()]) as legacy:
        initialized = legacy.session.initialize_result
        assert initialized is not None
        assert not initialized.capabilities.extensions and initialized.capabilities.prompts is None
        with pytest.raises(MCPError) as refused:
            await _ask(legacy, "tasks/get", task_id)
    assert refused.value.code == -32021


def test_task_ids_are_unguessable_and_stored_only_hashed(
    runtime: Runtime, redis_client: redis.Redis
) -> None:
    ids = {runtime.stores.tasks.create(tenant=TENANT, kind="job", target="j", tool="t").task_id
           for _ in range(50)}  # fmt: skip
    assert len(ids) == 50 and all(len(i) == 32 for i in ids)  # 192 random bits each
    keys = set(redis_client.scan_iter("webctx:task:*"))
    assert keys == {f"webctx:task:{hashlib.sha256(i.encode()).hexdigest()}" for i in ids}
    assert not any(i in str(redis_client.hgetall(k)) for k in keys for i in ids)
    ttl = redis_client.ttl(next(iter(keys)))
    assert 0 < ttl <= runtime.settings.job_ttl_s
