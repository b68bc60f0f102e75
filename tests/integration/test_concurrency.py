"""Several jobs at once on several plain `webctx worker` processes, as a newcomer starts them:
in one folder, on the embedded vector store, with no queue options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from tests.conftest import ROOT, clean_env, redis_url, run_cli
from tests.integration.conftest import start_paced_web
from tests.testweb import LoopbackWeb
from webctx.models import Bundle

QUESTIONS = [
    "how do lithium-ion batteries degrade?",
    "what is lithium plating when charging in the cold?",
    "calendar ageing versus cycle ageing of batteries",
    "how does a sourdough starter work?",
    "how do lithium-ion batteries degrade?",  # the same question twice at once
]


Finished = tuple[int, str, str, float]


def _research_at_once(env: dict[str, str], questions: list[str]) -> list[Finished]:
    """Start one `webctx research` per question together; (exit code, stdout, stderr, seconds)."""
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "webctx.cli", "research", q, "--max-sources", "10"],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for q in questions
    ]  # fmt: skip
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=240)
        out.append((proc.returncode, stdout, stderr, time.monotonic() - started))
    return out


def test_two_plain_workers_in_one_folder_finish_concurrent_jobs_long_before_the_watchdog(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(
        **test_web.env(),
        CELERY_BROKER_URL=redis_url(),
        WEBCTX_QDRANT_PATH=str(tmp_path / "qdrant"),  # one folder: both see the same store
    )
    first = start_worker(env)
    second = start_worker(env)
    # The second cannot open the embedded store: it says so once and leaves its queues alone.
    # (A machine without a browser adds a "not consuming render" line to both logs.)
    refusal = [line for line in second.log.read_text().splitlines()
               if "not consuming" in line and "not consuming render:" not in line]  # fmt: skip
    assert len(refusal) == 1, second.log.read_text()[-3000:]
    assert "store" in refusal[0] and "rank" in refusal[0] and "WEBCTX_QDRANT_URL" in refusal[0]
    assert not [line for line in first.log.read_text().splitlines()
                if "not consuming" in line and "not consuming render:" not in line]  # fmt: skip

    results = _research_at_once(env, QUESTIONS)
    for code, stdout, stderr, seconds in results:
        assert code == 0, stderr[-3000:]
        assert seconds < 120, f"a job took {seconds:.0f} s (watchdog at 600 s)"
        bundle = Bundle.model_validate_json(stdout)
        assert bundle.chunks
        assert not [f for f in bundle.failures if f.stage in ("store", "rank")], bundle.failures
    # Both took work: the second worker fetched and embedded for the jobs.
    assert "webctx.fetch" in second.log.read_text() or "webctx.embed" in second.log.read_text()


def test_each_worker_gets_its_own_node_name(
    tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    texts = [start_worker(env, "-Q", "search,fetch").log.read_text() for _ in range(2)]
    assert not any("DuplicateNodenameWarning" in t for t in texts), texts
    names = [
        next(line for line in t.splitlines() if line.endswith(" ready.")).split("] ")[-1]
        for t in texts
    ]
    assert names[0] != names[1], names
    assert all(n.startswith("webctx-") for n in names), names


def test_a_store_worker_that_cannot_open_the_store_exits_with_one_clear_line(
    tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q"))
    start_worker(env, "-Q", "store,rank")
    second = subprocess.run(
        [sys.executable, "-m", "webctx.cli", "worker", "-Q", "store,rank"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert second.returncode != 0
    lines = [x for x in (second.stdout + second.stderr).splitlines() if "cannot serve" in x]
    assert len(lines) == 1 and "rank, store" in lines[0] and "in use" in lines[0], lines


def test_a_worker_left_without_the_store_takes_it_over_when_its_holder_stops(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, start_worker
) -> None:
    env = clean_env(
        **test_web.env(), CELERY_BROKER_URL=redis_url(), WEBCTX_QDRANT_PATH=str(tmp_path / "q")
    )
    holder = start_worker(env)
    standby = start_worker(env)
    holder.stop()
    deadline = time.monotonic() + 60
    while "Started consuming from rank" not in standby.log.read_text():
        assert time.monotonic() < deadline, standby.log.read_text()[-3000:]
        time.sleep(0.5)
    ((code, stdout, stderr, _),) = _research_at_once(env, QUESTIONS[:1])
    assert code == 0, stderr[-3000:]
    assert Bundle.model_validate_json(stdout).chunks


def test_a_broker_worker_beside_the_local_service_refuses_in_one_line_and_the_job_ends(
    redis_client: redis.Redis, data_dir: Path, start_worker
) -> None:
    # One data directory for both: a broker worker's embedded store is the local service's.
    web = start_paced_web(1.5)  # within the test web's 2 s read timeout
    try:
        broker = clean_env(**web.env(), CELERY_BROKER_URL=redis_url(),
                           WEBCTX_WORKER_LOST_AFTER_S="3")  # fmt: skip
        local = clean_env(**web.env())
        first = start_worker(broker)
        submitted = run_cli(broker, "research", QUESTIONS[0], "--max-sources", "4", "--no-wait")
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        job_id = submitted.stdout.strip()
        deadline = time.monotonic() + 60
        while not web.hits or redis_client.hget(f"webctx:job:{job_id}:meta", "status") is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(first.proc.pid, signal.SIGKILL)  # mid-fetch; its store lock goes with it
        first.proc.wait(timeout=10)
        started = run_cli(local, "service", "start")  # a local client: the service takes the store
        assert started.returncode == 0, started.stderr[-3000:]
        service = json.loads(started.stdout)["pid"]
        _wait_log(data_dir / "service.log", "vector store opened")
        try:
            refused = subprocess.run(
                [sys.executable, "-m", "webctx.cli", "worker"], env=broker, cwd=ROOT,
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise AssertionError("the worker waited for the service's store") from None
        assert refused.returncode != 0
        lines = [x for x in (refused.stdout + refused.stderr).splitlines() if "cannot serve" in x]
        assert len(lines) == 1, refused.stderr[-3000:]
        assert f"local service (pid {service})" in lines[0] and "webctx service stop" in lines[0]
        # The fix it names: the service stopped, a worker started again finishes the job.
        assert run_cli(local, "service", "stop").returncode == 0
        start_worker(broker)
        deadline = time.monotonic() + 120
        while redis_client.hget(f"webctx:job:{job_id}:meta", "status") not in SETTLED:
            assert time.monotonic() < deadline, redis_client.hgetall(f"webctx:job:{job_id}:meta")
            time.sleep(0.2)
        meta = redis_client.hgetall(f"webctx:job:{job_id}:meta")
        assert meta["status"] == "succeeded", meta
    finally:
        web.stop()


SETTLED = ("succeeded", "failed", "cancelled")


def _wait_log(log: Path, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not (log.exists() and text in log.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{text!r} not in {log}"
        time.sleep(0.1)
