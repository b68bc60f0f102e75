"""Batches with real worker processes on the test Redis, the loopback test web, the CLI and
the HTTP API."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import clean_env, redis_url, run_cli
from tests.integration.conftest import ApiProcess, free_port, items_after_a_research_job
from tests.testweb import LoopbackWeb
from webctx.jobs.batches import BatchStatus, BatchStore
from webctx.jobs.store import JobStore
from webctx.jobs.tenants import TenantStore

QUESTIONS = [
    "why does the SEI layer keep growing?",
    "lithium plating when charging a cold battery",
    "calendar ageing vs cycle ageing",
    "particle cracking in layered oxide cathodes",
    "electrolyte decomposition and gassing",
    "measuring battery state of health",
    "do solid-state batteries age differently?",
    "does DC fast charging hurt EV battery health?",
]


def _env(web: LoopbackWeb, tmp: Path, **extra: str) -> dict[str, str]:
    return clean_env(
        **web.env(),
        CELERY_BROKER_URL=redis_url(),
        WEBCTX_QDRANT_PATH=str(tmp / "q"),
        WEBCTX_VISIBILITY_TIMEOUT_S="8",  # a SIGKILLed worker's tasks come back quickly
        WEBCTX_TASK_TIME_LIMIT_S="7",
        WEBCTX_JOB_TIMEOUT_S="120",
        WEBCTX_BATCH__TICK_S="1",
        **extra,
    )


def _write(path: Path, questions: list[str]) -> Path:
    lines = [json.dumps({"id": f"q-{i}", "question": q}) for i, q in enumerate(questions)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _status(client: redis.Redis, batch_id: str) -> BatchStatus:
    return BatchStore(client, JobStore(client)).status(batch_id)


def _wait(client: redis.Redis, batch_id: str, until: str, timeout_s: float = 90) -> BatchStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = _status(client, batch_id)
        if (until == "finished" and status.finished) or (
            until.startswith("done>=") and status.done + status.failed >= int(until[6:])
        ):
            return status
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} not {until}: {status}")


@pytest.mark.slow
def test_batch_survives_a_sigkilled_worker_and_a_resubmission_redoes_nothing(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = _env(test_web, tmp_path, WEBCTX_BATCH__CONCURRENCY="2")
    io = start_worker(env, "-Q", "search,fetch,embed", "-n", "io@%h", "-c", "4")
    start_worker(env, "-Q", "store,rank", "-n", "vec@%h", "-c", "4")
    questions = _write(tmp_path / "q.jsonl", QUESTIONS)
    submitted = run_cli(
        env, "batch", "submit", str(questions), "--name", "w1", "--max-sources", "3"
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    batch_id = submitted.stdout.strip()

    _wait(redis_client, batch_id, "done>=2")
    os.killpg(io.proc.pid, signal.SIGKILL)  # mid-batch: its unacked tasks come back
    io.proc.wait(timeout=10)
    start_worker(env, "-Q", "search,fetch,embed", "-n", "io2@%h", "-c", "4")
    status = _wait(redis_client, batch_id, "finished", timeout_s=150)
    assert status.state == "finished" and status.done + status.failed == len(QUESTIONS)
    assert status.done >= len(QUESTIONS) - 1, status
    assert status.stats["pages_downloaded"] > 0 and status.stats["tokens_embedded"] > 0

    out = tmp_path / "results.jsonl"
    listed = run_cli(env, "batch", "results", batch_id, "--out", str(out))
    assert listed.returncode == 0, listed.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [f"q-{i}" for i in range(len(QUESTIONS))]
    assert all(("bundle" in r) != ("error" in r) for r in records)

    hits, tokens = sum(test_web.hits.values()), test_web.embeddings_control.stats.tokens
    again_out = tmp_path / "again.jsonl"
    again = run_cli(env, "batch", "submit", str(questions), "--name", "w1", "--max-sources", "3",
                    "--wait", "--out", str(again_out))  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip() == batch_id and "resuming" in again.stderr
    assert sum(test_web.hits.values()) == hits  # no page downloaded
    assert test_web.embeddings_control.stats.tokens == tokens  # nothing embedded
    again = _status(redis_client, batch_id).stats
    assert again == {**status.stats, "elapsed_s": status.stats["elapsed_s"]}
    assert again_out.read_text() == out.read_text()

    changed = _write(tmp_path / "changed.jsonl", QUESTIONS[:3])
    refused = run_cli(env, "batch", "submit", str(changed), "--name", "w1")
    assert refused.returncode == 1 and "different file" in refused.stderr


def test_bad_lines_are_refused_with_line_numbers_before_anything_is_queued(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "question": "fine?"}\nnot json\n{"question": "no id"}\n'
        '{"id": "a", "question": "dup"}\n{"id": "b", "question": ""}\n'
    )
    env = clean_env(CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    done = run_cli(env, "batch", "submit", str(bad), "--name", "bad")
    assert done.returncode == 2
    for expected in ("line 2: not JSON", "line 3: missing id", "line 4: duplicate id",
                     "line 5: empty question"):  # fmt: skip
        assert expected in done.stderr, done.stderr
    assert redis_client.dbsize() == 0  # nothing queued, no state written


def test_http_batch_cancel_stops_queued_items_and_results_stream_in_order(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = _env(test_web, tmp_path, WEBCTX_BATCH__CONCURRENCY="1")
    start_worker(env, "-c", "4")
    api = ApiProcess(env, tmp_path / "api.log")
    try:
        api.wait_ready(timeout_s=90)
        tenants = TenantStore(redis_client)
        keys = {t: tenants.create_key(t)[0] for t in ("alpha", "beta")}
        items = [{"id": f"q-{i}", "question": q} for i, q in enumerate(QUESTIONS * 2)]
        auth = {"Authorization": f"Bearer {keys['alpha']}"}
        with httpx.Client(base_url=api.url, headers=auth, timeout=30) as c:
            resp = c.post("/v1/batches", params={"name": "n1", "max_sources": 3}, json=items)
            assert resp.status_code == 202, resp.text
            batch_id = resp.json()["id"]
            assert resp.json()["total"] == 16
            bad = c.post("/v1/batches", params={"name": "n2"}, content=b'{"id": 1}\n')
            assert bad.status_code == 422 and "line 1: empty question" in bad.json()["message"]
            other = httpx.get(f"{api.url}/v1/batches/{batch_id}",
                              headers={"Authorization": f"Bearer {keys['beta']}"})  # fmt: skip
            assert other.status_code == 404
            _wait(redis_client, batch_id, "done>=2")
            cancelled = c.delete(f"/v1/batches/{batch_id}")
            assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
            time.sleep(3)
            status = c.get(f"/v1/batches/{batch_id}").json()
            assert status["state"] == "cancelled" and status["running"] == 0
            finished = status["done"] + status["failed"]
            assert finished <= 4 and status["cancelled"] == 16 - finished, status
            with c.stream("GET", f"/v1/batches/{batch_id}/results") as streamed:
                assert streamed.headers["content-type"].startswith("application/x-ndjson")
                records = [json.loads(line) for line in streamed.iter_lines() if line]
        ids = [r["id"] for r in records]
        assert len(ids) == finished and ids == sorted(ids, key=lambda i: int(i[2:]))
    finally:
        api.stop()


@pytest.mark.slow
def test_interactive_job_goes_ahead_of_queued_batch_items(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    """Six batch items queued (low priority), then a research job, then one worker thread
    starts: the research job finishes before most of the items (its tasks go first)."""
    env = _env(test_web, tmp_path, WEBCTX_BATCH__CONCURRENCY="6")
    after, finished = items_after_a_research_job(env, tmp_path, redis_client, start_worker)
    assert after >= 4, finished


def test_embedded_batch_waits_and_writes_every_item_in_input_order(
    test_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = clean_env(**test_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    questions = _write(tmp_path / "q.jsonl", QUESTIONS[:3])
    out = tmp_path / "out.jsonl"
    done = run_cli(env, "batch", "submit", str(questions), "--name", "e", "--max-sources", "3",
                   "--wait", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.strip()) == 32  # the batch id
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["q-0", "q-1", "q-2"]
    assert all(r["bundle"]["chunks"] for r in records), records
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert summary["state"] == "finished" and summary["done"] == 3
    assert summary["stats"]["tokens_embedded"] > 0 and summary["stats"]["cost_usd"] > 0


def test_batch_items_wanting_the_same_pages_download_each_once(
    test_web: LoopbackWeb, tmp_path: Path
) -> None:
    env = clean_env(**test_web.env(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"),
                    WEBCTX_BATCH__CONCURRENCY="4", WEBCTX_WORKER_CONCURRENCY="8")  # fmt: skip
    questions = _write(tmp_path / "q.jsonl", [QUESTIONS[0]] * 4)  # four items at once
    before = test_web.hits.copy()
    done = run_cli(env, "batch", "submit", str(questions), "--name", "same", "--max-sources", "4",
                   "--wait", "--out", str(tmp_path / "out.jsonl"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert summary["done"] == 4
    files = ("/robots.txt", "/.well-known/tdmrep.json")  # read once per origin, not pages
    pages = {path: n for path, n in (test_web.hits - before).items() if path not in files}
    assert pages and max(pages.values()) == 1, pages
    assert summary["stats"]["pages_downloaded"] == len(pages)
    assert summary["stats"]["pages_reused"] == 4 * 4 - len(pages)


def test_a_page_past_the_cache_window_is_revalidated_with_a_conditional_get(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    # An entry outlives its window 7 times over (REVALIDATE_WINDOWS): with a 2 s window a
    # loaded machine's first batch, pause and second start outlasted the 14 s, and the
    # second batch downloaded afresh. 8 s leaves 56 s for that.
    ttl_s = 8
    env = _env(test_web, tmp_path, WEBCTX_PAGE_CACHE_TTL_S=str(ttl_s))
    start_worker(env, "-c", "4")
    questions = _write(tmp_path / "q.jsonl", QUESTIONS[:2])
    first = run_cli(env, "batch", "submit", str(questions), "--name", "r1", "--max-sources", "3",
                    "--wait", "--out", str(tmp_path / "r1.jsonl"))  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    downloaded = json.loads(first.stderr.strip().splitlines()[-1])["stats"]["pages_downloaded"]
    assert downloaded > 0
    time.sleep(ttl_s + 0.5)  # every page is now past its window
    revalidated_before = sum(test_web.not_modified.values())
    second = run_cli(env, "batch", "submit", str(questions), "--name", "r2", "--max-sources", "3",
                     "--wait", "--out", str(tmp_path / "r2.jsonl"))  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    stats = json.loads(second.stderr.strip().splitlines()[-1])["stats"]
    assert stats["pages_downloaded"] == 0, stats
    assert stats["pages_revalidated"] == downloaded
    assert sum(test_web.not_modified.values()) - revalidated_before == downloaded
    bundles = [
        json.loads(line)["bundle"] for line in (tmp_path / "r2.jsonl").read_text().splitlines()
    ]
    assert all(b["chunks"] for b in bundles)


class OwnRedis:
    """A redis-server of this test's own on an ephemeral port, AOF in `data`: stopped and
    started again with the same data, as a restart or failover would."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes", "--dir", str(self.data)]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        """SHUTDOWN: the AOF is flushed, every record survives the restart."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(redis.ConnectionError):
                redis.Redis.from_url(self.url).shutdown()
            self.proc.wait(timeout=10)


def test_batch_wait_polls_through_a_redis_outage(
    test_web: LoopbackWeb, tmp_path: Path, start_worker
) -> None:
    own = OwnRedis(tmp_path)
    own.start()
    env = clean_env(**test_web.env(), CELERY_BROKER_URL=own.url,
                    WEBCTX_QDRANT_PATH=str(tmp_path / "q"), WEBCTX_BATCH__TICK_S="1")  # fmt: skip
    questions = _write(tmp_path / "q.jsonl", QUESTIONS[:2])
    out, log = tmp_path / "out.jsonl", (tmp_path / "cli.log").open("w")
    cli = subprocess.Popen(
        [sys.executable, "-m", "webctx.cli", "batch", "submit", str(questions), "--name", "o",
         "--max-sources", "2", "--wait", "--out", str(out)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        client = redis.Redis.from_url(own.url)
        deadline = time.monotonic() + 30
        while not client.keys("webctx:batch:*") and time.monotonic() < deadline:
            time.sleep(0.1)
        client.close()
        time.sleep(1.5)  # the CLI is polling now
        own.stop()
        # Down until the CLI has met the outage (it polls every few seconds; a fixed 4 s
        # fell between two polls on a loaded machine), then a little more.
        deadline = time.monotonic() + 60
        while "unreachable, still waiting" not in (tmp_path / "cli.log").read_text():
            assert cli.poll() is None, (tmp_path / "cli.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the CLI never reported the outage"
            time.sleep(0.2)
        time.sleep(2)
        assert cli.poll() is None, (tmp_path / "cli.log").read_text()[-2000:]
        own.start()
        start_worker(env, "-c", "2")
        assert cli.wait(timeout=120) == 0, (tmp_path / "cli.log").read_text()[-3000:]
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["id"] for r in records] == ["q-0", "q-1"]
        assert "unreachable, still waiting" in (tmp_path / "cli.log").read_text()
    finally:
        if cli.poll() is None:
            cli.kill()
        own.stop()
        log.close()
