"""Per-tenant admission of jobs: a tenant's first few unfinished jobs go at the front of
the queues, a bounded number more wait behind every tenant's front jobs, and past both a
job is refused (`TooManyJobs`, 429 with `Retry-After`).

Two sorted sets per tenant hold its admitted, unfinished jobs, each scored by the moment
its slot lapses (submission + `WEBCTX_JOB_TIMEOUT_S` + `WEBCTX_ADMISSION__HOLD_S`):

    webctx:tenant:<t>:front    jobs published at priority 0 (at most `running`)
    webctx:tenant:<t>:behind   jobs published at the queued priority (at most `queued`)

`admit` is one Lua script (drop lapsed slots, count, take a slot), so concurrent
submitters (several API processes, the MCP server, `webctx research`) cannot together pass
a cap; `release` is called by the job store when a job finishes (succeeded, failed,
cancelled: the watchdog fails one whose workers died), and a slot whose release was lost
lapses at its score, so no slot is held for ever.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum

import redis

from webctx.errors import TooManyJobs

# KEYS: front, behind. ARGV: now, lapses_at, job_id, running, queued, key_ttl_s.
# Returns {slot, front count, behind count}: slot 1 front, 2 behind, 0 refused.
_ADMIT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
local front = redis.call('ZCARD', KEYS[1])
local behind = redis.call('ZCARD', KEYS[2])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then return {1, front, behind} end
if redis.call('ZSCORE', KEYS[2], ARGV[3]) then return {2, front, behind} end
local slot = 0
if front < tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
  front = front + 1
  slot = 1
elseif behind < tonumber(ARGV[5]) then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
  behind = behind + 1
  slot = 2
end
for i = 1, 2 do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('EXPIRE', KEYS[i], ARGV[6]) end
end
return {slot, front, behind}
"""


class Slot(StrEnum):
    """Where an admitted job's tasks go in the queues."""

    FRONT = "front"
    BEHIND = "behind"


@dataclass(frozen=True)
class Caps:
    """A tenant's caps: jobs at the front, jobs waiting behind, the retry hint, and how
    long a slot is held at most (the job's deadline and a grace)."""

    running: int
    queued: int
    retry_after_s: int
    lapse_s: float


class Admission:
    """The owner of the `front` and `behind` key families: admits and releases jobs."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._admit = client.register_script(_ADMIT)

    def _keys(self, tenant: str) -> list[str]:
        return [f"webctx:tenant:{tenant}:front", f"webctx:tenant:{tenant}:behind"]

    def admit(self, tenant: str, job_id: str, caps: Caps) -> Slot:
        """Take a slot for the job (the same one again for a job already admitted), or
        raise TooManyJobs, taking nothing, when the tenant's unfinished jobs fill both caps."""
        now = time.time()
        args: list[str | int] = [f"{now:.3f}", f"{now + caps.lapse_s:.3f}", job_id,
                                 caps.running, caps.queued, int(caps.lapse_s) + 1]  # fmt: skip
        slot, front, behind = self._admit(keys=self._keys(tenant), args=args)
        if int(slot) == 0:
            raise _refused(tenant, int(front) + int(behind), caps)
        return Slot.FRONT if int(slot) == 1 else Slot.BEHIND

    def release(self, tenant: str, job_id: str) -> None:
        """Free the job's slot (a finished job; a job refused after admission)."""
        pipe = self._redis.pipeline()
        for key in self._keys(tenant):
            pipe.zrem(key, job_id)
        pipe.execute()

    def counts(self, tenant: str) -> tuple[int, int]:
        """The tenant's (front, behind) slots held now, lapsed ones not counted."""
        now = time.time()
        pipe = self._redis.pipeline()
        for key in self._keys(tenant):
            pipe.zcount(key, f"({now:.3f}", "+inf")
        front, behind = pipe.execute()
        return int(front), int(behind)


def _refused(tenant: str, unfinished: int, caps: Caps) -> TooManyJobs:
    return TooManyJobs(
        f"tenant {tenant!r} has {unfinished} unfinished jobs, its cap "
        f"(WEBCTX_ADMISSION__RUNNING={caps.running} plus WEBCTX_ADMISSION__QUEUED="
        f"{caps.queued}): retry in {caps.retry_after_s} s, once one of them has finished",
        retry_after_s=caps.retry_after_s,
        unfinished=unfinished,
    )
