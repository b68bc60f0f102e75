"""Running count of the bytes each tenant's jobs keep in the state Redis.

A sorted set per tenant (`webctx:tenant:<t>:stored`: job id -> when its keys expire) and a
hash (`webctx:tenant:<t>:stored-bytes`: job id -> bytes, and `*` -> their sum) are kept
together by one Lua script: a write adds the bytes of what it stored and pushes the job's
expiry to `ttl_s` from now; every call first drops the jobs whose expiry passed, so the sum
is what live jobs hold. Counted: the job's request record and its bundle (the JSON written),
not the pages (shared by content hash) nor the small bookkeeping keys.

`add` with a limit is the admission check: atomic, so two submissions racing for the last
bytes cannot both pass. O(expired jobs) per call, not O(keyspace) like `webctx.keys.tenant_bytes`.
"""

from __future__ import annotations

import time

import redis

from webctx.errors import QuotaExceeded
from webctx.jobs.refs import live_with_prefix

# KEYS: stored (zset), bytes (hash). ARGV: now, expires_at, ttl_s, job_id, nbytes, limit.
# Returns {1, total} when added, {0, total} when the limit refused it (nothing written).
_ADD = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, job in ipairs(expired) do
  local held = tonumber(redis.call('HGET', KEYS[2], job) or '0')
  redis.call('HDEL', KEYS[2], job)
  redis.call('HINCRBY', KEYS[2], '*', -held)
  redis.call('ZREM', KEYS[1], job)
end
local total = tonumber(redis.call('HGET', KEYS[2], '*') or '0')
local nbytes = tonumber(ARGV[5])
local limit = tonumber(ARGV[6])
if limit > 0 and nbytes > 0 and total + nbytes > limit then
  return {0, total}
end
if nbytes > 0 then
  redis.call('HINCRBY', KEYS[2], ARGV[4], nbytes)
  total = redis.call('HINCRBY', KEYS[2], '*', nbytes)
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
else
  redis.call('DEL', KEYS[2])
end
return {1, total}
"""


class StoredBytes:
    """Bytes each tenant's live jobs hold; the owner of the `stored` key families."""

    def __init__(self, client: redis.Redis, *, ttl_s: int) -> None:
        self._redis = client
        self.ttl_s = ttl_s
        self._add = client.register_script(_ADD)

    def _keys(self, tenant: str) -> list[str]:
        return [f"webctx:tenant:{tenant}:stored", f"webctx:tenant:{tenant}:stored-bytes"]

    def _run(self, tenant: str, job_id: str, nbytes: int, limit: int) -> tuple[bool, int]:
        now = time.time()
        args: list[str | int] = [
            f"{now:.3f}",
            f"{now + self.ttl_s:.3f}",
            self.ttl_s,
            job_id,
            nbytes,
            limit,
        ]
        added, total = self._add(keys=self._keys(tenant), args=args)
        return bool(added), int(total)

    def add(self, tenant: str, job_id: str, nbytes: int, *, limit: int = 0) -> int:
        """Count `nbytes` more for the job and keep it `ttl_s` from now; the tenant's total.

        With `limit` > 0, raises QuotaExceeded (and counts nothing) if the total would pass it.
        """
        added, total = self._run(tenant, job_id, nbytes, limit)
        if not added:
            raise _refused(tenant, total, nbytes, limit)
        return total

    def check(self, tenant: str, nbytes: int, *, limit: int) -> None:
        """Raise QuotaExceeded if `nbytes` more would pass `limit` (0: never); writes nothing
        but the removal of expired jobs."""
        if limit > 0:
            total = self.total(tenant)
            if total + nbytes > limit:
                raise _refused(tenant, total, nbytes, limit)

    def total(self, tenant: str) -> int:
        """Bytes the tenant's live jobs hold (expired ones dropped first)."""
        return self._run(tenant, "", 0, 0)[1]

    def jobs_with_prefix(self, tenant: str, prefix: str) -> list[str]:
        """Ids of the tenant's live jobs that start with `prefix`: one ZSCAN of this index
        of them (`webctx.jobs.refs`)."""
        return live_with_prefix(self._redis, self._keys(tenant)[0], prefix)


def _refused(tenant: str, total: int, nbytes: int, limit: int) -> QuotaExceeded:
    return QuotaExceeded(
        f"tenant {tenant!r} stores {total} bytes of jobs; this one ({nbytes} bytes) would "
        f"pass its limit of {limit} (WEBCTX_TENANT_MAX_STORED_BYTES): wait for older jobs "
        "to expire",
        stored_bytes=total,
        limit_bytes=limit,
    )
