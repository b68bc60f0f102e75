"""The job-submission path warmed ahead (an API or MCP process at start): the first job's
submission then loads nothing inside that job's first moments. Each case is a fresh
interpreter against the test Redis as broker and state store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis

from tests.conftest import ROOT, clean_env, redis_url

_SUBMIT = """
import json, sys
from webctx.models import JobRequest
from webctx.settings import get_settings
from webctx.workers.deps import state_stores
from webctx.workers.pipeline import submit_job, warm_submission

stores = state_stores(get_settings())
if sys.argv[1] == "warm":
    warm_submission()
before = set(sys.modules)
submit_job(stores.jobs, JobRequest(question="what is a glacier?"), timeout_s=60)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _modules_loaded_by_first_submit(mode: str, data_dir: Path) -> list[str]:
    env = clean_env(CELERY_BROKER_URL=redis_url(), WEBCTX_DATA_DIR=str(data_dir))
    done = subprocess.run([sys.executable, "-c", _SUBMIT, mode], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_warmed_process_loads_nothing_at_its_first_submission(
    redis_client: redis.Redis, data_dir: Path
) -> None:
    cold = _modules_loaded_by_first_submit("cold", data_dir)
    assert "kombu.transport.redis" in cold and "celery.backends.redis" in cold
    assert _modules_loaded_by_first_submit("warm", data_dir) == []
    # Both submissions reached the broker: a plan and a deadline watchdog each, queued.
    lists = [k for k in redis_client.scan_iter() if redis_client.type(k) == "list"]
    assert sum(int(redis_client.llen(k)) for k in lists) == 4


def test_warming_with_no_broker_answering_is_no_error(data_dir: Path) -> None:
    from webctx.api.runtime import _warm_submission

    _warm_submission()  # this process's broker: the data directory's service, not running
