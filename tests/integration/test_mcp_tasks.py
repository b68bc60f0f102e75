"""The MCP tasks extension over stdio, spoken by a raw client that writes the extension's
JSON-RPC exactly as its schema says (tests/rawmcp.py), against `webctx mcp` and the local
service it starts: a task completes with its progress in `statusMessage` and its result
inline, is cancelled and then fetches nothing more, and survives a SIGKILL of the local
service and a restart of the MCP server. A client without the extension, or on a
2025-11-25 `initialize` session, gets no task. (HTTP, API keys and the SDK clients:
tests/integration/test_mcp.py.)"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import ROOT, clean_env, service_pid
from tests.integration.conftest import start_paced_web
from tests.rawmcp import WITH_TASKS, RawStdio, poll
from tests.testweb import LoopbackWeb
from webctx.models import Bundle
from webctx.workers.state_server import socket_path

QUESTION = "how do lithium-ion batteries degrade?"
ARGS = {"question": QUESTION, "max_sources": 6, "top_k": 8, "token_budget": 800}
SLOW_PAGE_S = 1.0
"""Each page of this module's web answers after a second, and the service fetches two at
a time: a job's pages arrive in waves, so a test can act between two of them."""


@pytest.fixture(scope="module")
def slow_web() -> Iterator[LoopbackWeb]:
    web = start_paced_web(delay_s=SLOW_PAGE_S)
    yield web
    web.stop()


def _env(web: LoopbackWeb, tmp_path: Path) -> dict[str, str]:
    # A killed service's tasks come back 3-4 s after its last beat, not 30-40 s.
    return clean_env(**web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"),
                     WEBCTX_WORKER_CONCURRENCY="2", WEBCTX_WORKER_LOST_AFTER_S="3")  # fmt: skip


def _server(env: dict[str, str]) -> RawStdio:
    return RawStdio([sys.executable, "-m", "webctx.cli", "mcp"], env=env, cwd=str(ROOT))


def _start_task(client: RawStdio) -> dict[str, Any]:
    answer = client.request("tools/call", {"name": "web_context", "arguments": ARGS})
    assert "result" in answer, answer
    return dict(answer["result"])


def _fetched_some(task: dict[str, Any]) -> bool:
    """The task's job has fetched a page: `... fetched 2/6 pages ...`."""
    return re.search(r" fetched [1-9]", task.get("statusMessage", "")) is not None


def _page_hits(web: LoopbackWeb) -> int:
    return sum(n for path, n in web.hits.items() if path.endswith(".html"))


def test_a_task_completes_with_progress_and_its_result_inline(
    slow_web: LoopbackWeb, tmp_path: Path
) -> None:
    client = _server(_env(slow_web, tmp_path))
    try:
        discovered = client.request("server/discover")["result"]
        assert discovered["capabilities"]["extensions"] == {"io.modelcontextprotocol/tasks": {}}
        assert "2026-07-28" in discovered["supportedVersions"]
        created = _start_task(client)
        assert created["resultType"] == "task" and created["status"] == "working"
        assert len(created["taskId"]) >= 32 and created["ttlMs"] > 0
        assert created["pollIntervalMs"] > 0 and created["createdAt"].endswith("Z")
        seen = poll(client, created["taskId"])
        gone = client.request("tasks/result", {"taskId": created["taskId"]})
        unknown = client.request("tasks/get", {"taskId": created["taskId"][:-1] + "x"})
        progress_notes = client.notifications("notifications/progress")
    finally:
        client.close()
    done = seen[-1]
    assert done["status"] == "completed" and done["resultType"] == "complete", done
    messages = [s.get("statusMessage", "") for s in seen[:-1]]
    assert any("fetched" in m and "/6 pages" in m for m in messages), messages
    assert done["result"]["isError"] is False
    bundle = Bundle.model_validate(done["result"]["structuredContent"])
    assert bundle.chunks and all(s.url.startswith(slow_web.site.url) for s in bundle.sources)
    assert QUESTION in done["result"]["content"][0]["text"]
    assert progress_notes == []  # a task reports progress through tasks/get, not notifications
    assert gone["error"]["code"] == -32601  # tasks/result was removed from the extension
    assert unknown["error"]["code"] == -32602


def test_a_client_without_the_extension_or_on_initialize_gets_no_task(
    slow_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = _env(slow_web, tmp_path)
    quick = {**ARGS, "wait_s": 0}
    plain = _server(env)
    try:
        answer = plain.request("tools/call", {"name": "web_context", "arguments": quick},
                               capabilities={})  # fmt: skip
        asked = plain.request("tasks/get", {"taskId": "anything"}, capabilities={})
    finally:
        plain.close()
    assert answer["result"]["resultType"] == "complete" and "taskId" not in answer["result"]
    assert answer["result"]["structuredContent"]["status"] in ("queued", "running")
    assert asked["error"]["code"] == -32021
    legacy = _server(env)  # a 2025-11-25 session that declares the extension at initialize
    try:
        init = legacy.request("initialize", {
            "protocolVersion": "2025-11-25", "clientInfo": {"name": "legacy", "version": "1"},
            "capabilities": WITH_TASKS}, capabilities=None)  # fmt: skip
        legacy.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        called = legacy.request("tools/call", {"name": "web_context", "arguments": quick},
                                capabilities=None)  # fmt: skip
        refused = legacy.request("tasks/get", {"taskId": "anything"}, capabilities=None)
    finally:
        legacy.close()
    capabilities = init["result"]["capabilities"]
    assert "extensions" not in capabilities and "prompts" not in capabilities
    assert "taskId" not in called["result"] and called["result"]["structuredContent"]["job_id"]
    assert refused["error"]["code"] == -32021


def test_a_cancelled_task_ends_cancelled_and_fetches_nothing_more(
    slow_web: LoopbackWeb, tmp_path: Path
) -> None:
    client = _server(_env(slow_web, tmp_path))
    before = _page_hits(slow_web)
    try:
        created = _start_task(client)
        task_id = created["taskId"]
        # Two pages at a time, a second each: cancel once the first wave is in.
        cancelled_at = poll(client, task_id, timeout_s=120, stop=_fetched_some)[-1]
        ack = client.request("tasks/cancel", {"taskId": task_id})
        at_cancel = _page_hits(slow_web)
        after = poll(client, task_id, timeout_s=30)[-1]
        time.sleep(4 * SLOW_PAGE_S)  # any wave that was to start has started by now
        settled = _page_hits(slow_web)
        time.sleep(3 * SLOW_PAGE_S)
        later = _page_hits(slow_web)
    finally:
        client.close()
    assert ack["result"]["resultType"] == "complete"
    assert after["status"] == "cancelled" and "result" not in after, after
    assert "tasks/cancel" in after["statusMessage"]
    assert later == settled  # nothing is fetched after the cancel took effect
    assert settled - at_cancel <= 2  # at most the wave already under way
    assert settled - before < ARGS["max_sources"], slow_web.hits  # the rest never asked for
    print(f"\n[tasks/cancel] at {cancelled_at['statusMessage']!r}: {at_cancel - before} pages"
          f" requested then, {settled - before} in all")


def test_a_task_survives_a_sigkill_of_the_local_service_and_a_new_mcp_server(
    slow_web: LoopbackWeb, tmp_path: Path, data_dir: Path
) -> None:
    env = _env(slow_web, tmp_path)
    first = _server(env)
    try:
        task_id = _start_task(first)["taskId"]
        poll(first, task_id, timeout_s=120, stop=_fetched_some)
        service = _kill_service(data_dir)
        during = first.request("tasks/get", {"taskId": task_id})  # starts another service
    finally:
        first.kill()  # the host restarted too: a new MCP server process asks next
    assert during["result"]["status"] in ("working", "completed"), during
    second = _server(env)
    try:
        seen = poll(second, task_id, timeout_s=150)
    finally:
        second.close()
    assert seen[-1]["status"] == "completed", seen[-1]
    assert Bundle.model_validate(seen[-1]["result"]["structuredContent"]).chunks
    restarted = service_pid(data_dir)
    assert restarted is not None and restarted != service


def test_get_job_after_a_sigkill_of_the_local_service_starts_another_and_finishes(
    slow_web: LoopbackWeb, tmp_path: Path, data_dir: Path
) -> None:
    # A host without the tasks extension: web_context hands back a job id, get_job waits.
    env = _env(slow_web, tmp_path)
    client = _server(env)
    try:
        started = client.request("tools/call", {"name": "web_context",
                                                "arguments": {**ARGS, "wait_s": 0}},
                                 capabilities={})  # fmt: skip
        job_id = started["result"]["structuredContent"]["job_id"]
        service = _kill_service(data_dir)
        finished = client.request("tools/call", {"name": "get_job",
                                                 "arguments": {"job_id": job_id, "wait_s": 150}},
                                  capabilities={}, timeout_s=180)  # fmt: skip
    finally:
        client.close()
    result = finished["result"]
    assert not result.get("isError"), result
    assert Bundle.model_validate(result["structuredContent"]).chunks
    restarted = service_pid(data_dir)
    assert restarted is not None and restarted != service


def _kill_service(data_dir: Path) -> int:
    """SIGKILL the local service mid-job (its lock and address file stay) and wait until
    its Valkey, which follows it, stops answering: the next read meets no state store,
    whatever the load. Returns the killed service's pid."""
    service = service_pid(data_dir)
    assert service is not None
    os.kill(service, signal.SIGKILL)
    _wait_gone(socket_path((data_dir / "valkey").resolve()))
    return service


def _wait_gone(socket: Path, timeout_s: float = 10) -> None:
    """Until nothing answers on the state store's socket."""
    client = redis.Redis(unix_socket_path=str(socket), socket_timeout=1)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                client.ping()
            except redis.ConnectionError:
                return
            time.sleep(0.05)
    finally:
        client.close()
    raise AssertionError(f"the killed service's state store still answers on {socket}")


BATCH = {"questions": [QUESTION, "what is lithium plating when fast charging?"],
         "max_sources": 2, "token_budget": 400}  # fmt: skip


def test_a_batch_task_counts_its_questions_and_lists_how_each_ended(
    slow_web: LoopbackWeb, tmp_path: Path
) -> None:
    client = _server(_env(slow_web, tmp_path))
    try:
        created = client.request("tools/call", {"name": "web_context_batch", "arguments": BATCH})
        assert created["result"]["resultType"] == "task", created
        seen = poll(client, created["result"]["taskId"], timeout_s=240)
        out = seen[-1]["result"]["structuredContent"]
        first = client.request("tools/call", {"name": "get_job", "arguments": {
            "job_id": out["items"][0]["job_id"], "wait_s": 0}}, capabilities={})  # fmt: skip
    finally:
        client.close()
    assert seen[-1]["status"] == "completed", seen[-1]
    assert any(s["statusMessage"].startswith("running: ") for s in seen[:-1]), seen
    assert seen[-1]["statusMessage"] == "finished: 2 of 2 questions answered"
    assert [i["question"] for i in out["items"]] == BATCH["questions"]
    assert all(i["status"] == "succeeded" and i["passages"] for i in out["items"]), out
    text = seen[-1]["result"]["content"][0]["text"]
    assert all(f'job_id="{i["job_id"]}"' in text for i in out["items"])
    bundle = Bundle.model_validate(first["result"]["structuredContent"])
    assert bundle.question == QUESTION and bundle.chunks  # get_job reads an item's bundle


def test_a_batch_without_the_extension_waits_and_the_same_call_finds_it_again(
    slow_web: LoopbackWeb, tmp_path: Path
) -> None:
    client = _server(_env(slow_web, tmp_path))
    call = {"name": "web_context_batch", "arguments": {**BATCH, "wait_s": 0}}
    try:
        started = client.request("tools/call", call, capabilities={})["result"]
        deadline, again = time.monotonic() + 240, started
        while again["structuredContent"]["state"] == "running" and time.monotonic() < deadline:
            again = client.request("tools/call", {**call, "arguments": {**BATCH, "wait_s": 20}},
                                   capabilities={})["result"]  # fmt: skip
    finally:
        client.close()
    assert "taskId" not in started and started["structuredContent"]["state"] == "running"
    assert "call web_context_batch again" in started["content"][0]["text"]
    assert again["structuredContent"]["batch_id"] == started["structuredContent"]["batch_id"]
    assert again["structuredContent"]["state"] == "finished", again
    assert again["structuredContent"]["done"] == 2
