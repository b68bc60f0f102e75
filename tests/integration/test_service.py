"""One local service per data directory, started by whichever client needs it: MCP
servers, the CLI and the API share it; it survives SIGKILL (the next client starts
another, which finishes the job), exits when idle, and needs no configuration."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis
from mcp import Client, StdioServerParameters

from tests.conftest import (
    ROOT,
    CliProcess,
    clean_env,
    local_services,
    run_cli,
    service_pid,
    state_server_pid,
)
from tests.integration.conftest import ApiProcess
from tests.testweb import LoopbackWeb
from webctx.models import Bundle
from webctx.workers.service_client import running_service

QUESTION = "how do lithium-ion batteries degrade?"
ARGS = {"question": QUESTION, "max_sources": 6, "top_k": 5, "token_budget": 800, "wait_s": 110}
PAGE = "/energy-notes/sei-growth.html"
SCHEDULED_PAGE = "/energy-notes/lithium-plating.html"
CLI_POLL_S = 0.5
"""Between checks that each start a CLI process (half a second of CPU apiece)."""


def _env(web: LoopbackWeb, **extra: str) -> dict[str, str]:
    # A killed service's tasks come back 3-4 s after its last beat, not 30-40 s.
    return clean_env(**web.env(), WEBCTX_WORKER_LOST_AFTER_S="3", **extra)


def _wait_for(check: Any, timeout_s: float, what: str, *, every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_four_mcp_servers_in_one_folder_share_one_service_and_download_each_page_once(
    test_web: LoopbackWeb, data_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    params = StdioServerParameters(command=sys.executable, args=["-m", "webctx.cli", "mcp"],
                                   env=_env(test_web), cwd=str(folder))  # fmt: skip
    before = dict(test_web.hits)
    results: list[Any] = []

    async def ask() -> None:
        async with Client(params, read_timeout_seconds=150) as client:
            results.append(await client.call_tool("web_context", ARGS))

    async with anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(ask)
    assert len(results) == 4 and not any(r.is_error for r in results), results
    bundles = [Bundle.model_validate(r.structured_content) for r in results]
    assert all(b.chunks for b in bundles)
    downloads = {path: n - before.get(path, 0) for path, n in test_web.hits.items()}
    assert max(downloads.values()) == 1, downloads  # each page (and robots.txt) once in all
    assert len(local_services(data_dir)) == 1
    log = (data_dir / "service.log").read_text()
    assert log.count("service listening") == 1 and "already runs" not in log
    assert list(folder.iterdir()) == []  # nothing written where the clients started

    # A new MCP server (the IDE restarted) finds what the others stored.
    async with Client(params, read_timeout_seconds=60) as client:
        source = await client.call_tool("get_source", {"ref": bundles[0].sources[0].url})
    assert not source.is_error, source.content
    assert source.structured_content["content_sha256"] == bundles[0].sources[0].content_sha256


@pytest.mark.slow
def test_a_service_killed_mid_job_is_started_again_by_the_next_client_and_the_job_ends(
    test_web: LoopbackWeb, data_dir: Path
) -> None:
    env = _env(test_web)
    submitted = run_cli(env, "research", QUESTION, "--max-sources", "8", "--no-wait")
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    job_id = submitted.stdout.strip()
    first = service_pid(data_dir)
    assert first is not None

    def fetched() -> dict[str, Any] | None:
        status = json.loads(run_cli(env, "status", job_id).stdout)
        return status if status["fetched"] >= 1 else None

    at_kill = _wait_for(fetched, 60, "a page fetched", every_s=CLI_POLL_S)
    os.kill(first, signal.SIGKILL)  # its lock and address file stay behind; its Valkey ends
    _wait_for(lambda: service_pid(data_dir) is None, 10, "the service gone")
    assert (data_dir / "service.json").exists()

    def finished() -> dict[str, Any] | None:
        status = json.loads(run_cli(env, "status", job_id).stdout)  # each call: a client
        return status if status["status"] in ("succeeded", "failed") else None

    status = _wait_for(finished, 90, "the job to end", every_s=CLI_POLL_S)
    second = service_pid(data_dir)
    assert second is not None and second != first
    if status["status"] == "failed":
        assert status["error"]
    else:
        shown = run_cli(env, "bundle", job_id)
        bundle = Bundle.model_validate_json(shown.stdout)
        assert bundle.chunks  # ranked from the reopened store
    assert status["fetched"] >= at_kill["fetched"]  # no page fetched before the kill is lost
    assert status["fetched"] + status["failed"] >= status["urls"]
    print(
        f"\n[service SIGKILL] at the kill: fetched {at_kill['fetched']} of {at_kill['urls']}; "
        f"job {status['status']}: fetched {status['fetched']}, failed {status['failed']}"
    )


@pytest.mark.slow
def test_a_stale_lock_and_socket_are_recovered_and_an_idle_service_exits(
    data_dir: Path,
) -> None:
    # Beat's re-index tick runs more often than the idle time: its own tick is not work.
    env = clean_env(
        WEBCTX_EMBEDDING_PROVIDER="hash", WEBCTX_SERVICE_IDLE_S="1", WEBCTX_INDEX__TICK_S="0.3"
    )
    started = run_cli(env, "service", "start")
    assert started.returncode == 0, started.stderr[-3000:]
    first = json.loads(started.stdout)["pid"]
    valkey = state_server_pid(data_dir)
    assert valkey is not None
    os.kill(valkey, signal.SIGKILL)  # before the service: its socket file stays behind
    os.kill(first, signal.SIGKILL)  # a lock file, an address, a dead socket left
    _wait_for(
        lambda: service_pid(data_dir) is None and state_server_pid(data_dir) is None, 10, "kill"
    )
    assert (data_dir / "service.lock").exists() and (data_dir / "service.json").exists()
    again = run_cli(env, "service", "start")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["pid"] != first
    # Checked in this process: a CLI's start can outlast the 1 s idle time on a busy machine.
    assert service_pid(data_dir) == json.loads(again.stdout)["pid"]
    # Idle for a second (no task, no queued message, no request): it exits, and its
    # Valkey with it.
    _wait_for(lambda: service_pid(data_dir) is None, 30, "the idle exit")
    _wait_for(lambda: state_server_pid(data_dir) is None, 10, "Valkey stopped")
    assert not (data_dir / "service.json").exists()
    assert run_cli(env, "service", "status").returncode == 1


def test_a_service_whose_valkey_died_still_stops_on_sigterm(data_dir: Path) -> None:
    # Beat ticks often, so its thread is publishing (and reconnecting) when Valkey dies.
    env = clean_env(WEBCTX_EMBEDDING_PROVIDER="hash", WEBCTX_SERVICE_IDLE_S="0",
                    WEBCTX_INDEX__TICK_S="0.2")  # fmt: skip
    started = run_cli(env, "service", "start")
    assert started.returncode == 0, started.stderr[-3000:]
    pid = json.loads(started.stdout)["pid"]
    _wait_for(lambda: b" ready." in (data_dir / "service.log").read_bytes(), 60, "ready")
    valkey = state_server_pid(data_dir)
    assert valkey is not None
    os.kill(valkey, signal.SIGKILL)
    time.sleep(1.0)  # beat's next ticks find no broker and retry
    os.kill(pid, signal.SIGTERM)
    # Beat's thread, stuck reconnecting to a broker that is gone, no longer holds the exit.
    _wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 30, "the exit")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_refresh_waited_on_waits_for_a_run_in_progress_and_then_indexes(
    test_web: LoopbackWeb, data_dir: Path
) -> None:
    # Beat's run of a source added a moment ago can hold it when a caller asks for a run:
    # the caller's --wait must end with the page indexed, not with the other run busy.
    env = _env(test_web)
    page = test_web.site.url + PAGE
    added = run_cli(env, "sources", "add", page, "--tenant", "alpha")
    assert added.returncode == 0, added.stderr[-3000:]
    source_id = added.stdout.strip()
    service = running_service(data_dir)
    assert service is not None
    state = redis.Redis.from_url(service.state_url)
    lock = f"webctx:index:lock:alpha:{source_id}"
    assert state.set(lock, "scheduled", nx=True, ex=60)  # as beat's run would hold it
    waiting = subprocess.Popen(
        [sys.executable, "-m", "webctx.cli", "sources", "refresh", "--wait", "--timeout", "60",
         "--tenant", "alpha"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        time.sleep(3.0)
        assert waiting.poll() is None, waiting.communicate()  # still waiting for the lock
        state.delete(lock)  # the other run ends
        out, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
        state.close()
    assert waiting.returncode == 0, err[-3000:]
    assert "in progress" not in out, out
    found = run_cli(env, "search", "SEI growth", "--format", "json", "--tenant", "alpha")
    assert found.returncode == 0, found.stderr[-3000:]
    assert page in {hit["url"] for hit in json.loads(found.stdout)}


@pytest.mark.slow
def test_with_no_configuration_the_api_serves_with_keys_and_the_index_is_kept(
    test_web: LoopbackWeb, data_dir: Path, tmp_path: Path
) -> None:
    env = _env(test_web, WEBCTX_INDEX__TICK_S="1")
    created = run_cli(env, "keys", "create", "--tenant", "alpha")
    assert created.returncode == 0, created.stderr[-3000:]
    key = created.stdout.strip()
    page = test_web.site.url + PAGE
    assert run_cli(env, "sources", "add", page, "--tenant", "alpha").returncode == 0
    refreshed = run_cli(env, "sources", "refresh", "--wait", "--timeout", "120",
                        "--tenant", "alpha")  # fmt: skip
    assert refreshed.returncode == 0, refreshed.stderr[-3000:]
    found = run_cli(env, "search", "SEI growth", "--format", "json", "--tenant", "alpha")
    assert found.returncode == 0, found.stderr[-3000:]
    assert page in {hit["url"] for hit in json.loads(found.stdout)}
    api = ApiProcess(env, log=tmp_path / "api.log")
    try:
        api.wait_ready()
        listed = httpx.get(api.url + "/v1/sources", headers={"Authorization": f"Bearer {key}"})
        assert listed.status_code == 200 and [s["url"] for s in listed.json()] == [page]
        assert httpx.get(api.url + "/v1/sources").status_code == 401
    finally:
        api.stop()
    assert len(local_services(data_dir)) == 1
    # The service's beat indexes a new source on its own (no refresh asked for).
    scheduled = test_web.site.url + SCHEDULED_PAGE
    assert run_cli(env, "sources", "add", scheduled, "--tenant", "beta").returncode == 0

    def indexed() -> bool:
        listed = run_cli(env, "sources", "list", "--format", "json", "--tenant", "beta")
        return bool(json.loads(listed.stdout)[0]["runs"])

    _wait_for(indexed, 60, "a scheduled run", every_s=CLI_POLL_S)


def test_a_batch_waiting_client_resumes_it_after_the_service_restarts(
    test_web: LoopbackWeb, data_dir: Path, tmp_path: Path
) -> None:
    env = _env(test_web)
    items = tmp_path / "q.jsonl"
    questions = [QUESTION, "what limits fast charging of batteries?"]
    items.write_text("".join(json.dumps({"id": f"q{n}", "question": q}) + "\n"
                             for n, q in enumerate(questions)))  # fmt: skip
    out = tmp_path / "out.jsonl"
    waiting = CliProcess(env, ["batch", "submit", str(items), "--name", "restart",
                               "--max-sources", "3", "--wait", "--out", str(out)],
                         log=tmp_path / "batch.log")  # fmt: skip
    try:
        first = _wait_for(lambda: service_pid(data_dir), 60, "the service")
        _wait_for(lambda: b"running" in waiting.log.read_bytes(), 60, "the batch running")
        stopped = run_cli(env, "service", "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert waiting.proc.wait(timeout=120) == 0, waiting.log.read_text()[-3000:]
    finally:
        waiting.stop()
    assert service_pid(data_dir) not in (None, first)  # started again by the waiting client
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in results) == ["q0", "q1"]


def test_the_client_modules_load_no_model_no_engine_and_no_worker() -> None:
    client_modules = ["webctx.cli.main", "webctx.cli.app", "webctx.api.mcp", "webctx.api.http",
                      "webctx.workers.service_client", "webctx.workers.index_client",
                      "webctx.workers.pipeline"]  # fmt: skip
    heavy = (
        "torch",
        "onnxruntime",
        "sentence_transformers",
        "qdrant_edge",
        "qdrant_client",
        "openai",
        "trafilatura",
        "playwright",
        "celery.worker",
        "celery.concurrency",
        "celery.apps",
    )
    code = (f"import importlib, json, sys\n"
            f"for m in {client_modules!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r} "
            f"or m.startswith({heavy!r}))))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == []
