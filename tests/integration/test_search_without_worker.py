"""`webctx search` in broker mode with the embedded engine asks a worker to search; with no
worker on its queue it says so within seconds instead of waiting 30 s for a traceback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import clean_env, redis_url, run_cli

# It times the CLI: run alone (`make test` runs serial tests after the parallel part), as
# with six busy test workers a CLI's start alone took 25 s on two cores.
pytestmark = pytest.mark.serial


def test_search_with_no_worker_on_its_queue_says_so_within_seconds(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    env = clean_env(
        CELERY_BROKER_URL=redis_url(),
        WEBCTX_QDRANT_PATH=str(tmp_path / "q"),
        WEBCTX_EMBEDDING_PROVIDER="hash",
    )
    started = time.monotonic()
    out = run_cli(env, "search", "walrus", timeout_s=60)
    elapsed = time.monotonic() - started
    assert out.returncode == 1, out.stdout + out.stderr
    assert "no worker consumes the 'rank' queue" in out.stderr
    assert "webctx worker" in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 3
    # The CLI's own start (imports) is part of it; the wait itself is about 4 s.
    assert elapsed < 15, elapsed
    # The search it gave up on expires: a worker started later drops it, not runs it.
    queues = [k for k in redis_client.keys("rank*") if redis_client.type(k) == "list"]
    left = [json.loads(m) for key in queues for m in redis_client.lrange(key, 0, -1)]
    searches = [m for m in left if m["headers"]["task"] == "webctx.index.search"]
    assert searches and all(m["headers"]["expires"] for m in searches), left
