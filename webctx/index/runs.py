"""Re-index runs in Redis: a source's run lock, and the records of runs started by hand.

    webctx:index:lock:<tenant>:<source_id>   str   the run holding the source (SET NX EX)
    webctx:index:run:<run_id>                hash  pending, started_at, tenant, and each
                                                   finished source's report (JSON)

A scheduled run and a manual `webctx sources refresh` of the same source must not
interleave on its pages: each takes the source's lock first (it expires after the task
time limit, should its holder die). A manual run is a record the CLI and the API poll.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

import redis

RUN_TTL_S = 24 * 3600
"""A manual run's record is kept this long after its last report."""
_META = ("pending", "started_at", "tenant")


class RefreshRuns:
    """Source locks and manual run records (`webctx:index:lock:*`, `webctx:index:run:*`)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    @staticmethod
    def _lock(tenant: str, source_id: str) -> str:
        return f"webctx:index:lock:{tenant}:{source_id}"

    @staticmethod
    def _run(run_id: str) -> str:
        return f"webctx:index:run:{run_id}"

    def lock(self, tenant: str, source_id: str, *, holder: str, ttl_s: int) -> bool:
        """Take the source's run lock for `holder`; False while another run holds it."""
        return bool(self._redis.set(self._lock(tenant, source_id), holder, nx=True, ex=ttl_s))

    def unlock(self, tenant: str, source_id: str) -> None:
        """Release the source's run lock."""
        self._redis.delete(self._lock(tenant, source_id))

    def start(self, tenant: str, count: int) -> str:
        """Record a manual run of `count` sources, started by `tenant` (also with none: the
        run is its creator's to read); its id."""
        run_id = uuid.uuid4().hex
        key = self._run(run_id)
        fields: dict[Any, Any] = {"pending": count, "started_at": f"{time.time():.3f}",
                                  "tenant": tenant}  # fmt: skip
        pipe = self._redis.pipeline()
        pipe.hset(key, mapping=fields)
        pipe.expire(key, RUN_TTL_S)
        pipe.execute()
        return run_id

    def report(self, run_id: str, source_id: str, report: Mapping[str, Any]) -> None:
        """A source of the run finished: keep its report, one fewer pending."""
        key = self._run(run_id)
        pipe = self._redis.pipeline()
        pipe.hset(key, source_id, json.dumps(dict(report)))
        pipe.hincrby(key, "pending", -1)
        pipe.expire(key, RUN_TTL_S)
        pipe.execute()

    def status(self, run_id: str) -> dict[str, Any] | None:
        """pending count, tenant and finished sources' reports of a manual run."""
        raw = cast(dict[str, str], self._redis.hgetall(self._run(run_id)))
        if not raw:
            return None
        reports = {k: json.loads(v) for k, v in raw.items() if k not in _META}
        return {"run_id": run_id, "pending": int(raw["pending"]), "tenant": raw.get("tenant", ""),
                "sources": reports}  # fmt: skip

    def wait(
        self, run_id: str, *, timeout_s: float, poll: Callable[[], object] | None = None
    ) -> dict[str, Any] | None:
        """Poll a manual run until every source reported or `timeout_s` passed; `poll` is
        called before each look (the local service kept running)."""
        deadline = time.monotonic() + timeout_s
        status = self.status(run_id)
        while status is not None and status["pending"] > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
            if poll is not None:
                poll()
            status = self.status(run_id)
        return status
