"""A worker SIGKILLed as a whole, with the default settings: its tasks run again within
90 s. On Redis the live workers requeue a silent worker's unacked messages
(webctx/workers/liveness.py); on RabbitMQ the broker does, when the dead consumer's
connection drops. Real `webctx worker` processes, a real broker, the loopback web.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection, Exchange, Queue

from tests.conftest import redis_url
from tests.integration.test_durability import (
    BackgroundCli,
    MiniWeb,
    OwnRedis,
    StartWorker,
    own_redis,  # noqa: F401 - fixture
    sigkill,
    wait_until,
)
from tests.integration.test_durability import mini_web as mini_web  # noqa: F401 - fixture
from tests.integration.test_rabbitmq import amqp_url, rabbitmq  # noqa: F401 - fixtures
from webctx.models import Bundle
from webctx.workers import liveness
from webctx.workers.broker import RedisTransport

RECOVERY_BOUND_S = 90
# Everything the issue calls "the defaults": no visibility timeout, task time limit or job
# watchdog from the mini web's settings (it shortens them for the other durability tests).
DEFAULTED = ("WEBCTX_VISIBILITY_TIMEOUT_S", "WEBCTX_TASK_TIME_LIMIT_S", "WEBCTX_JOB_TIMEOUT_S")


def _defaults(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in DEFAULTED}


def _kill_mid_fetch_and_recover(
    web: MiniWeb, env: dict[str, str], tmp_path: Path, start_worker: StartWorker
) -> float:
    """Start a job, SIGKILL the fetch worker inside the slow page's fetch, start another:
    seconds from the kill to the job's bundle."""
    slow_hits = web.hits["/slow.html"]
    victim = start_worker(env, "-Q", "search,fetch", "-n", "victim@lost")
    start_worker(env, "-Q", "embed,store,rank", "-n", "steady@lost")
    cli = BackgroundCli(env, tmp_path, "cli", "--max-sources", "5", "--timeout", "150")
    wait_until(lambda: web.hits["/slow.html"] > slow_hits, 60, "the slow fetch")
    time.sleep(0.5)  # inside the 3 s page
    killed = time.monotonic()
    sigkill(victim)
    start_worker(env, "-Q", "search,fetch", "-n", "successor@lost")
    code, out, err = cli.wait(RECOVERY_BOUND_S + 60)
    recovered_s = time.monotonic() - killed
    assert code == 0, err[-3000:]
    bundle = Bundle.model_validate_json(out)
    assert bundle.failures == [] and bundle.stats.fetched == 5
    assert web.hits["/slow.html"] == slow_hits + 2  # the killed fetch ran again, once
    return recovered_s


@pytest.mark.slow
def test_sigkilled_worker_tasks_run_again_within_90s_on_redis_with_defaults(
    mini_web: MiniWeb,  # noqa: F811
    own_redis: OwnRedis,  # noqa: F811
    tmp_path: Path,
    start_worker: StartWorker,
) -> None:
    env = _defaults(mini_web.env(CELERY_BROKER_URL=own_redis.url,
                                 WEBCTX_QDRANT_PATH=str(tmp_path / "q")))  # fmt: skip
    recovered_s = _kill_mid_fetch_and_recover(mini_web, env, tmp_path, start_worker)
    assert recovered_s < RECOVERY_BOUND_S, f"took {recovered_s:.1f}s"
    print(f"\n[redis, defaults] job succeeded {recovered_s:.1f}s after the SIGKILL")


@pytest.mark.slow
def test_only_worker_sigkilled_its_replacement_reaps_it_within_90s(
    mini_web: MiniWeb,  # noqa: F811
    own_redis: OwnRedis,  # noqa: F811
    tmp_path: Path,
    start_worker: StartWorker,
) -> None:
    """No live worker saw the death: the replacement (a restarted container) requeues the
    dead one's tasks once its own beats have run for `lost_after`."""
    env = _defaults(mini_web.env(CELERY_BROKER_URL=own_redis.url,
                                 WEBCTX_QDRANT_PATH=str(tmp_path / "q")))  # fmt: skip
    slow_hits = mini_web.hits["/slow.html"]
    victim = start_worker(env, "-n", "victim@alone")
    cli = BackgroundCli(env, tmp_path, "cli", "--max-sources", "5", "--timeout", "150")
    wait_until(lambda: mini_web.hits["/slow.html"] > slow_hits, 60, "the slow fetch")
    time.sleep(0.5)
    killed = time.monotonic()
    sigkill(victim)
    start_worker(env, "-n", "replacement@alone")
    code, out, err = cli.wait(RECOVERY_BOUND_S + 60)
    recovered_s = time.monotonic() - killed
    assert code == 0, err[-3000:]
    assert Bundle.model_validate_json(out).stats.fetched == 5
    assert recovered_s < RECOVERY_BOUND_S, f"took {recovered_s:.1f}s"
    print(f"\n[redis, defaults, only worker] job succeeded {recovered_s:.1f}s after the SIGKILL")


@pytest.mark.slow
@pytest.mark.xdist_group("rabbitmq")
def test_sigkilled_worker_tasks_run_again_within_90s_on_rabbitmq_with_defaults(
    mini_web: MiniWeb,  # noqa: F811
    rabbitmq: str,  # noqa: F811
    redis_client: redis.Redis,
    tmp_path: Path,
    start_worker: StartWorker,
) -> None:
    env = _defaults(mini_web.env(CELERY_BROKER_URL=rabbitmq, WEBCTX_REDIS_URL=redis_url(),
                                 WEBCTX_QDRANT_PATH=str(tmp_path / "q")))  # fmt: skip
    recovered_s = _kill_mid_fetch_and_recover(mini_web, env, tmp_path, start_worker)
    assert recovered_s < RECOVERY_BOUND_S, f"took {recovered_s:.1f}s"
    print(f"\n[rabbitmq, defaults] job succeeded {recovered_s:.1f}s after the SIGKILL")


@pytest.mark.slow
@pytest.mark.parametrize("mini_web", [12.0], indirect=True)  # each embed call takes 12 s
def test_task_running_longer_than_lost_after_is_not_delivered_twice(
    mini_web: MiniWeb,  # noqa: F811
    own_redis: OwnRedis,  # noqa: F811
    tmp_path: Path,
    start_worker: StartWorker,
) -> None:
    """A beating worker is never taken for lost: with `lost_after` 3 s (a beat each second)
    its 12 s embed calls run once each, while another worker reaps."""
    qdrant = str(tmp_path / "q")
    env = _defaults(mini_web.env(CELERY_BROKER_URL=own_redis.url, WEBCTX_QDRANT_PATH=qdrant,
                                 WEBCTX_WORKER_LOST_AFTER_S="3"))  # fmt: skip
    workers = [
        start_worker(env, "-Q", "embed", "-n", "embedder@lost"),
        start_worker(env, "-Q", "search,fetch,store,rank", "-n", "others@lost"),
    ]
    done = BackgroundCli(env, tmp_path, "cli", "--max-sources", "5", "--timeout", "150")
    code, out, err = done.wait(150)
    assert code == 0, err[-3000:]
    assert Bundle.model_validate_json(out).stats.fetched == 5
    logs = "".join(worker.log.read_text() for worker in workers)
    received = re.findall(r"Task (webctx\.embed\[[0-9a-f-]+\]) received", logs)
    assert len(received) == 5 and len(set(received)) == len(received), received
    assert "tasks of a lost worker requeued" not in logs
    broker = redis.Redis.from_url(own_redis.url)
    assert broker.zcard(liveness.WORKERS_KEY) == 2  # both beat
    for worker in workers:
        worker.stop()
    assert broker.zcard(liveness.WORKERS_KEY) == 0  # a clean stop leaves the registry


# -- the reaper against a real Redis and kombu's own channel ----------------------------------
@pytest.fixture
def channel(redis_client: redis.Redis) -> Iterator[object]:
    """A channel of webctx's Redis transport that records what it holds, as a worker's."""
    liveness._active.set()
    conn = Connection(redis_url(), transport=RedisTransport)
    try:
        yield conn.default_channel
    finally:
        conn.close()
        liveness._active.clear()


QUEUE = Queue("lost-test", Exchange("lost-test"), routing_key="lost-test")


def _publish_and_take(channel: object, priorities: list[int]) -> list[object]:
    conn = channel.connection.client  # type: ignore[attr-defined]
    with conn.Producer() as producer:
        for n, priority in enumerate(priorities):
            producer.publish({"n": n}, exchange=QUEUE.exchange, routing_key="lost-test",
                             declare=[QUEUE], priority=priority)  # fmt: skip
    taken = [QUEUE(channel).get(no_ack=False) for _ in priorities]
    assert all(m is not None for m in taken)
    return taken


def test_reap_requeues_exactly_a_silent_holders_messages_once(
    channel: object, redis_client: redis.Redis
) -> None:
    client = channel.client  # type: ignore[attr-defined]
    taken = _publish_and_take(channel, [0, 9])  # two of kombu's priority lists
    held = liveness.held_key(liveness.WORKER_ID)
    assert redis_client.scard(held) == 2 and redis_client.hlen("unacked") == 2
    liveness.beat(client)
    liveness.beat(client, "alive")
    assert liveness.reap(channel, lost_after_s=30) == {}  # nobody silent
    time.sleep(1.2)
    liveness.beat(client, "alive")
    assert liveness.reap(channel, lost_after_s=1) == {liveness.WORKER_ID: 2}
    assert liveness.reap(channel, lost_after_s=1) == {}  # restored once
    assert redis_client.hlen("unacked") == 0 and not redis_client.exists(held)
    assert redis_client.zrange("webctx:workers", 0, -1) == ["alive"]
    again = [QUEUE(channel).get(no_ack=False) for _ in taken]
    assert sorted(m.payload["n"] for m in again) == [0, 1]  # type: ignore[union-attr]
    assert all(m.delivery_info["redelivered"] for m in again)  # type: ignore[union-attr]
    assert QUEUE(channel).get(no_ack=False) is None
    for message in again:
        message.ack()  # type: ignore[union-attr]
    assert redis_client.scard(held) == 0 and redis_client.hlen("unacked") == 0
    assert liveness.forget(client) and redis_client.zrange("webctx:workers", 0, -1) == ["alive"]
