"""A provider that is down, met as a user meets it: `webctx research` against a search
endpoint refusing connections, embeddings answering 500 forever, and 429 forever
(`Retry-After: 1`). The job fails within the bound with one line naming the provider, its
URL and the fix, and no page counted as failed; the next job fails at once (the shared
breaker); and once the provider answers again, jobs work with no step by hand. In the
embedded default (the local service, its Valkey) and in broker mode (real Redis, `webctx
worker` processes, the HTTP API), with the default settings.

The bounds are the goals (15, 20, 30 and 3 seconds), timed from the command's start with
the service already running: they leave several seconds on a loaded 2-core machine."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from mcp import Client, StdioServerParameters

from tests.conftest import ROOT, clean_env, redis_url, run_cli
from tests.integration.conftest import ApiProcess, start_paced_web
from tests.testweb import LoopbackWeb
from webctx.jobs.store import JobStore
from webctx.jobs.tenants import TenantStore
from webctx.models import Bundle
from webctx.workers.service_client import running_service

QUESTIONS = ["how do batteries degrade?", "why do lithium-ion batteries lose capacity?",
             "what shortens battery life?"]  # fmt: skip
COOLDOWN_S = 5.0  # WEBCTX_BREAKER__COOLDOWN_S's default


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Ran:
    """One `webctx research`: its wall time and output."""

    seconds: float
    returncode: int
    stdout: str
    stderr: str

    @property
    def line(self) -> str:
        """The error line: the last one on stderr."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    @property
    def job_id(self) -> str:
        found = re.search(r"job ([0-9a-f]{32})", self.line)
        assert found, self.stderr[-2000:]
        return found.group(1)


def research(env: dict[str, str], question: str) -> Ran:
    started = time.monotonic()
    done = run_cli(env, "research", question, "--max-sources", "6", timeout_s=240)
    return Ran(time.monotonic() - started, done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def web() -> Iterator[LoopbackWeb]:
    """The demo corpus, every page answering at once: a failed page is the provider's."""
    web = start_paced_web(delay_s=0)
    yield web
    web.stop()


@pytest.fixture(autouse=True)
def providers_back(web: LoopbackWeb) -> Iterator[None]:
    """Every test leaves the peers answering."""
    yield
    web.embeddings_control.recover()
    if web.search._server is None or web.search._server.should_exit:
        web.search.start()


def _env(web: LoopbackWeb, tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(**web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"), **extra)


def _local_jobs(data_dir: Path) -> JobStore:
    service = running_service(data_dir)
    assert service is not None
    return JobStore(redis.Redis.from_url(service.state_url, decode_responses=True))


def _job_seconds(jobs: JobStore, job_id: str) -> float:
    finished = jobs.finished_at(job_id)
    assert finished is not None
    return finished - jobs.created_at(job_id)


def assert_provider_failure(
    env: dict[str, str], ran: Ran, *, bound_s: float, says: list[str]
) -> None:
    """The job failed within `bound_s` with one line that says `says`, as a provider
    failure: reason provider_down, no page or query failed, no bundle printed."""
    assert ran.returncode == 1, ran.stderr[-3000:]
    assert ran.seconds <= bound_s, (ran.seconds, ran.stderr[-2000:])
    assert ran.line.startswith("error: job ") and len(ran.line) <= 300, ran.line
    for words in says:
        assert words in ran.line, ran.line
    assert ran.stdout == ""
    status = json.loads(run_cli(env, "status", ran.job_id).stdout)
    assert status["status"] == "failed" and status["reason"] == "provider_down", status
    assert status["failed"] == 0, status  # the pages are not what failed
    assert status["error"] in ran.line


def assert_next_job_fails_at_once(
    env: dict[str, str], jobs: JobStore, first: Ran, question: str
) -> None:
    """A job while the breaker is open fails in 3 s at most (its own time, in the job
    store: the command's start on a loaded machine is not the breaker's) with the line."""
    second = research(env, question)
    assert second.returncode == 1, second.stderr[-3000:]
    assert _outage(second.line) == _outage(first.line), second.line
    took = _job_seconds(jobs, second.job_id)
    assert took <= 3.0, (took, second.seconds)


def _outage(line: str) -> str:
    """The line without its job id, nor how long the outage has lasted."""
    return re.sub(r" for \d+ s:", " for N s:", line.split(" failed: ", 1)[-1])


def assert_jobs_work_again(env: dict[str, str], question: str) -> None:
    time.sleep(COOLDOWN_S + 0.5)  # the cool-down: the next call probes the provider
    back = research(env, question)
    assert back.returncode == 0, back.stderr[-3000:]
    assert Bundle.model_validate_json(back.stdout).chunks


def test_a_dead_search_endpoint_fails_the_job_in_seconds_then_at_once_until_it_is_back(
    web: LoopbackWeb, tmp_path: Path, data_dir: Path
) -> None:
    env = _env(web, tmp_path)
    assert run_cli(env, "service", "start").returncode == 0
    url = web.search.url
    web.search.stop()  # nothing listens there: connections are refused
    first = research(env, QUESTIONS[0])
    assert_provider_failure(env, first, bound_s=15, says=[
        f"search provider searxng at {url} refused connections", "(WEBCTX_SEARXNG_URL)"])
    assert_next_job_fails_at_once(env, _local_jobs(data_dir), first, QUESTIONS[1])
    web.search.start()  # restarted on the same address
    assert_jobs_work_again(env, QUESTIONS[2])


def test_embeddings_answering_500_forever_fail_the_job_as_a_provider_failure(
    web: LoopbackWeb, tmp_path: Path, data_dir: Path
) -> None:
    env = _env(web, tmp_path)
    assert run_cli(env, "service", "start").returncode == 0
    web.embeddings_control.fail_always(status=500)
    first = research(env, QUESTIONS[0])
    assert_provider_failure(env, first, bound_s=20, says=[
        f"embeddings provider openai at {web.embeddings.url}/v1 answered HTTP 500",
        "(OPENAI_BASE_URL)"])
    assert_next_job_fails_at_once(env, _local_jobs(data_dir), first, QUESTIONS[1])
    web.embeddings_control.recover()
    assert_jobs_work_again(env, QUESTIONS[2])


def test_embeddings_answering_429_forever_fail_the_job_once_the_rate_limit_budget_is_spent(
    web: LoopbackWeb, tmp_path: Path, data_dir: Path
) -> None:
    env = _env(web, tmp_path)
    assert run_cli(env, "service", "start").returncode == 0
    web.embeddings_control.fail_always(status=429, retry_after=1.0)
    first = research(env, QUESTIONS[0])
    assert_provider_failure(env, first, bound_s=30, says=[
        f"embeddings provider openai at {web.embeddings.url}/v1 answered 429 (rate limited)",
        "WEBCTX_EMBED__RPM"])
    requests = web.embeddings_control.stats.requests
    assert requests >= 10  # it was paced by each retry-after, not given up at once
    assert_next_job_fails_at_once(env, _local_jobs(data_dir), first, QUESTIONS[1])
    web.embeddings_control.recover()
    assert_jobs_work_again(env, QUESTIONS[2])


@pytest.mark.anyio
async def test_mcp_returns_a_provider_outage_as_a_tool_error(
    web: LoopbackWeb, tmp_path: Path
) -> None:
    web.embeddings_control.fail_always(status=500)
    params = StdioServerParameters(command=sys.executable, args=["-m", "webctx.cli", "mcp"],
                                   env=_env(web, tmp_path), cwd=str(ROOT))  # fmt: skip
    arguments = {"question": QUESTIONS[0], "max_sources": 6, "wait_s": 110}
    async with Client(params, read_timeout_seconds=120) as client:
        result = await client.call_tool("web_context", arguments)
    assert result.is_error
    text = result.content[0].text
    assert f"embeddings provider openai at {web.embeddings.url}/v1 answered HTTP 500" in text
    assert "(OPENAI_BASE_URL)" in text and len(text) <= 300 and "\n" not in text


@pytest.mark.slow
def test_broker_workers_share_the_breaker_and_the_api_reports_the_outage(
    web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = _env(web, tmp_path, CELERY_BROKER_URL=redis_url())
    # Two processes: the pages' embeddings on one, the question's and rank's on the other.
    start_worker(env, "-Q", "search,fetch,embed", "-n", "io@%h")
    start_worker(env, "-Q", "store,rank", "-n", "vec@%h")
    api = ApiProcess(env, tmp_path / "api.log")
    try:
        api.wait_ready()
        key = TenantStore(redis_client).create_key("local", rate_limit=100_000)[0]
        web.embeddings_control.fail_always(status=500)
        first = research(env, QUESTIONS[0])
        assert_provider_failure(env, first, bound_s=20, says=[
            f"embeddings provider openai at {web.embeddings.url}/v1 answered HTTP 500"])
        assert redis_client.keys("webctx:breaker:openai:*")  # in the broker's Redis
        jobs = JobStore(redis_client)
        assert_next_job_fails_at_once(env, jobs, first, QUESTIONS[1])
        # The HTTP API: the job's error is the line, its reason the outage.
        with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {key}"},
                          timeout=30) as client:  # fmt: skip
            job = client.get(f"/v1/jobs/{first.job_id}").json()
            assert job["status"] == "failed" and job["reason"] == "provider_down"
            assert job["error"] in first.line
            context = client.post("/v1/context", json={"question": QUESTIONS[1]})
            assert context.status_code == 503, context.text
            assert context.json()["error"] == "provider_down"
            assert _outage(context.json()["message"]) == _outage(job["error"])
        web.embeddings_control.recover()
        assert_jobs_work_again(env, QUESTIONS[2])
    finally:
        api.stop()
