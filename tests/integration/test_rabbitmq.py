"""RabbitMQ as the broker: a job through a real `webctx worker` on AMQP, job state in Redis."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection

from tests.conftest import clean_env, redis_url, run_cli
from tests.integration.conftest import items_after_a_research_job
from tests.testweb import LoopbackWeb
from webctx.models import Bundle

# One xdist worker runs this module: its tests share the broker's queues (by name).
pytestmark = pytest.mark.xdist_group("rabbitmq")

AMQP_URL = os.environ.get("WEBCTX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
QUEUES = ("search", "fetch", "render", "embed", "store", "rank", "reindex")
QUESTION = "how do lithium-ion batteries degrade?"


def _rabbitmqctl(*args: str) -> bool:
    """Run rabbitmqctl on this machine's broker; False when it cannot (absent, no rights)."""
    try:
        done = subprocess.run(["rabbitmqctl", *args], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def amqp_url() -> Iterator[str]:
    """A vhost of this test process when rabbitmqctl can make one (queues are named by stage,
    so another run's workers would take this run's tasks, and its clean-up delete them),
    else the broker's default vhost."""
    vhost = f"webctx-test-{os.getpid()}"
    granted = _rabbitmqctl("add_vhost", vhost) and _rabbitmqctl(
        "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"
    )
    if not granted:
        yield AMQP_URL
        return
    try:
        yield AMQP_URL.rstrip("/") + "/" + vhost
    finally:
        _rabbitmqctl("delete_vhost", vhost)


def _delete_queues(url: str) -> None:
    """Delete webctx's queues: gone with their messages, and declared anew (with the
    arguments of this version, x-max-priority) by the next worker."""
    with Connection(url, connect_timeout=5) as conn:
        for queue in QUEUES:
            channel = conn.channel()
            try:
                channel.queue_delete(queue)
            except conn.channel_errors:
                pass  # not declared yet
            finally:
                channel.close()


@pytest.fixture
def rabbitmq(amqp_url: str) -> Iterator[str]:
    """The machine's RabbitMQ, with webctx's queues deleted before and after the test."""
    try:
        _delete_queues(amqp_url)
    except OSError as exc:
        pytest.fail(f"no RabbitMQ at {amqp_url}: {exc}")
    yield amqp_url
    _delete_queues(amqp_url)  # the held deadline watchdog went back to its queue at worker stop


def test_job_runs_through_rabbitmq_with_job_state_in_redis(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, rabbitmq: str, start_worker
) -> None:
    env = clean_env(
        **test_web.env(),
        CELERY_BROKER_URL=rabbitmq,
        WEBCTX_REDIS_URL=redis_url(),
        WEBCTX_QDRANT_PATH=str(tmp_path / "q"),
    )
    worker = start_worker(env, "-c", "8")
    assert b"Connected to amqp://guest:**@127.0.0.1:5672/" in worker.log.read_bytes()
    done = run_cli(env, "research", QUESTION, "--max-sources", "8", "--format", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    bundle = Bundle.model_validate_json(done.stdout)
    assert bundle.chunks and bundle.sources
    assert all(s.url.startswith(test_web.site.url) for s in bundle.sources)
    # Job state went to Redis (the broker holds only messages).
    meta = redis_client.hgetall(f"webctx:job:{bundle.job_id}:meta")
    assert meta["status"] == "succeeded"


def test_rabbitmq_broker_without_a_redis_job_store_is_refused(rabbitmq: str) -> None:
    env = clean_env(CELERY_BROKER_URL=rabbitmq, WEBCTX_EMBEDDING_PROVIDER="hash")
    done = run_cli(env, "research", QUESTION, timeout_s=60)
    assert done.returncode == 1
    assert "WEBCTX_REDIS_URL" in done.stderr


def test_interactive_job_goes_ahead_of_queued_batch_items_on_rabbitmq(
    test_web: LoopbackWeb, tmp_path: Path, redis_client: redis.Redis, rabbitmq: str, start_worker
) -> None:
    """Six batch items queued, then a research job, then one worker thread starts: the
    research job finishes before most of the items (AMQP serves higher priorities first)."""
    env = clean_env(**test_web.env(), CELERY_BROKER_URL=rabbitmq, WEBCTX_REDIS_URL=redis_url(),
                    WEBCTX_QDRANT_PATH=str(tmp_path / "q"), WEBCTX_BATCH__CONCURRENCY="6",
                    WEBCTX_BATCH__TICK_S="1")  # fmt: skip
    after, finished = items_after_a_research_job(env, tmp_path, redis_client, start_worker)
    assert after >= 4, finished
