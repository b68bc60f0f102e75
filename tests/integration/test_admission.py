"""Per-tenant admission over real HTTP: a `webctx api` process, Redis, one `webctx
worker` thread started once the jobs are queued, the loopback web. Tenant gamma's batch
is queued, then tenant alpha's burst, partly refused (429 with Retry-After, the same words
over MCP and `webctx research`), the rest held with no task in the queues but RUNNING's,
then tenant beta's one job, which finishes ahead of alpha's held jobs and of the batch's
items."""

from __future__ import annotations

import ast
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import httpx
import httpx2
import redis
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import clean_env, redis_url, run_cli
from tests.integration.conftest import ApiProcess
from tests.testweb import LoopbackWeb
from webctx.jobs.store import JobStore
from webctx.jobs.tenants import TenantStore
from webctx.models import JobStatus
from webctx.workers.celeryconfig import queue_lists

RUNNING, QUEUED = 1, 4
SMALL = {"max_sources": 2, "top_k": 4, "token_budget": 600}
TOPICS = ["SEI layer growth", "lithium plating cold charging", "calendar vs cycle ageing",
          "particle cracking layered oxide cathodes", "electrolyte decomposition gassing",
          "LFP versus NMC ageing", "fast charging and heat"]  # fmt: skip


def _post_all(url: str, key: str, questions: list[str]) -> list[httpx.Response]:
    headers = {"Authorization": f"Bearer {key}"}

    def post(question: str) -> httpx.Response:
        return httpx.post(f"{url}/v1/jobs", json={"question": question, **SMALL},
                          headers=headers, timeout=30)  # fmt: skip

    with ThreadPoolExecutor(len(questions)) as pool:  # all at once, as a burst does
        return list(pool.map(post, questions))


def _jobs_with_tasks(client: redis.Redis) -> set[str]:
    """The jobs with a task in the broker: waiting in a queue, or reserved by a worker
    (kombu's `unacked`); deadline watchdogs (`rank`, force) not counted."""
    raw = [m for name in queue_lists() for m in client.lrange(name, 0, -1)]  # type: ignore[union-attr]
    raw += [json.dumps(json.loads(m)[0]) for m in client.hvals("unacked")]  # type: ignore[union-attr]
    found = set()
    for message in raw:
        headers = json.loads(message)["headers"]
        if "force" not in str(headers.get("kwargsrepr", "")):
            args = ast.literal_eval(headers["argsrepr"])
            found.add(str(args[0]))
    return found


class MostAtOnce:
    """Samples, until stopped, how many of `jobs` have a task queued or running at once:
    the broker's messages first, then the statuses (a job ended by then is not counted)."""

    def __init__(self, client: redis.Redis, jobs: list[str]) -> None:
        self.client, self.jobs, self.most, self.samples = client, jobs, 0, 0
        self.seen: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        store = JobStore(self.client)
        while not self.stop.is_set():
            with_tasks = _jobs_with_tasks(self.client)
            statuses = {j: store.status(j) for j in self.jobs}
            active = [j for j, s in statuses.items() if s is JobStatus.RUNNING
                      or (s is JobStatus.QUEUED and j in with_tasks)]  # fmt: skip
            self.most, self.samples = max(self.most, len(active)), self.samples + 1
            self.seen.update(active)
            time.sleep(0.05)

    def done(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.most


async def _mcp_refusal(url: str, key: str) -> str:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
        result = await client.call_tool("web_context", {"question": "one more", "wait_s": 0})
    assert result.is_error, result.content
    return str(result.content[0].text)  # type: ignore[union-attr]


def test_a_tenants_burst_is_capped_and_another_tenants_job_goes_ahead_of_its_queue(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(**test_web.env(), CELERY_BROKER_URL=redis_url(),
                    WEBCTX_QDRANT_PATH=str(tmp_path / "q"),
                    WEBCTX_ADMISSION__RUNNING=str(RUNNING), WEBCTX_ADMISSION__QUEUED=str(QUEUED),
                    WEBCTX_ADMISSION__RETRY_AFTER_S="3")  # fmt: skip
    store = TenantStore(redis_client)
    keys = {t: store.create_key(t, rate_limit=100_000)[0] for t in ("alpha", "beta", "gamma")}
    api = ApiProcess(env, tmp_path / "api.log")
    try:
        api.wait_ready(timeout_s=90)
        items = [{"id": f"g-{i}", "question": q, **SMALL} for i, q in enumerate(TOPICS[:3])]
        batch = httpx.post(f"{api.url}/v1/batches", params={"name": "running"}, json=items,
                           headers={"Authorization": f"Bearer {keys['gamma']}"})  # fmt: skip
        assert batch.status_code == 202, batch.text
        batch_jobs = [f"{batch.json()['id']}-{i}" for i in range(len(items))]
        burst = _post_all(api.url, keys["alpha"], TOPICS)  # no worker yet: none finishes
        assert sorted(r.status_code for r in burst) == [202] * (RUNNING + QUEUED) + [429] * 2
        refused = [r for r in burst if r.status_code == 429]
        for resp in refused:
            assert resp.headers["Retry-After"] == "3"
            body = resp.json()
            assert body["error"] == "too_many_jobs"
            assert body["message"] == (
                "tenant 'alpha' has 5 unfinished jobs, its cap (WEBCTX_ADMISSION__RUNNING=1 "
                "plus WEBCTX_ADMISSION__QUEUED=4): retry in 3 s, once one of them has finished"
            )
        said = anyio.run(_mcp_refusal, api.url, keys["alpha"])
        assert said.endswith(": " + refused[0].json()["message"])  # the SDK prefixes the tool
        cli = run_cli({**env, "WEBCTX_LOCAL_TENANT": "alpha"}, "research", "one more",
                      "--no-wait")  # fmt: skip
        assert cli.returncode == 1 and refused[0].json()["message"] in cli.stderr, cli.stderr

        other = _post_all(api.url, keys["beta"], ["second-life EV packs in stationary storage"])
        assert other[0].status_code == 202, other[0].text
        beta_job = other[0].json()["job_id"]
        alpha_jobs = [r.json()["job_id"] for r in burst if r.status_code == 202]
        jobs = JobStore(redis_client)
        # Held: RUNNING of alpha's jobs have their plan task queued, the others none at all.
        queued = _jobs_with_tasks(redis_client)
        assert len(queued & set(alpha_jobs)) == RUNNING and beta_job in queued, queued
        held = jobs.admission.held("alpha")
        assert len(held) == QUEUED and not set(held) & queued, held
        cancelled = held.pop()  # cancelled while held: never sent, ends cancelled
        gone = httpx.delete(f"{api.url}/v1/jobs/{cancelled}",
                            headers={"Authorization": f"Bearer {keys['alpha']}"})  # fmt: skip
        assert gone.status_code == 200 and gone.json()["status"] == "cancelled", gone.text

        sampler = MostAtOnce(redis_client, alpha_jobs)
        start_worker(env, "-c", "1")  # one thread: the queues' order decides who goes first
        finished: dict[str, float] = {}
        deadline = time.monotonic() + 240
        everyone = [beta_job, *alpha_jobs, *batch_jobs]
        while len(finished) < len(everyone) and time.monotonic() < deadline:
            for job_id in everyone:
                at = jobs.finished_at(job_id)
                if at is not None:
                    finished[job_id] = at
            time.sleep(0.5)
        assert len(finished) == len(everyone), finished
        most, samples = sampler.done(), sampler.samples
        statuses = {j: jobs.status(j).value for j in finished}
        assert statuses.pop(cancelled) == "cancelled" and cancelled not in sampler.seen
        assert set(statuses.values()) == {"succeeded"}, statuses
        # At no moment had more than RUNNING of alpha's jobs a task queued or running.
        assert most == RUNNING and samples > 20, (most, samples)
        # alpha's first job went beside beta's; its held ones got their tasks only as
        # alpha's slot freed, so every one of them ends after beta's job.
        assert all(finished[j] > finished[beta_job] for j in held), finished
        # A batch running keeps its place: its items (queued before every job here) end
        # after beta's job and after most of alpha's, each published at the front in turn.
        assert all(finished[j] > finished[beta_job] for j in batch_jobs), finished
        last_alpha = sorted(finished[j] for j in alpha_jobs)[-2]
        assert sum(1 for j in batch_jobs if finished[j] > last_alpha) >= 2, finished
        # Every finished job freed its slot: alpha may submit its full caps again.
        assert jobs.admission.counts("alpha") == (0, 0)
        again = _post_all(api.url, keys["alpha"], TOPICS[:1])
        assert again[0].status_code == 202, again[0].text
    finally:
        api.stop()
