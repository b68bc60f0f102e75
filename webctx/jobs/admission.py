"""Per-tenant admission of jobs: a tenant's first few unfinished jobs go to the workers, a
bounded number more are held back (their tasks are not in the queues at all) until one of
its running jobs ends, and past both a job is refused (`TooManyJobs`, 429 with `Retry-After`).

Sorted sets per tenant hold its admitted, unfinished jobs, each scored by the moment its
slot lapses (submission + `WEBCTX_JOB_TIMEOUT_S` + `WEBCTX_ADMISSION__HOLD_S`):

    webctx:tenant:<t>:front    jobs whose tasks are queued or running (at most `running`)
    webctx:tenant:<t>:behind   jobs admitted past `running`, not yet held (being recorded),
                               or, with `WEBCTX_ADMISSION__HOLD=false`, published behind
                               every tenant's front jobs at `queued_priority`
    webctx:tenant:<t>:held     recorded jobs waiting for a front slot, none of their tasks sent

and `webctx:admission:held` names the tenants with held jobs (the reconciler's list);
`webctx:admission:front` holds every tenant's front jobs (`<tenant>/<job>`), which the batch
feeder reads to yield to interactive jobs (`interactive_besides`). `running` + `queued` caps
a tenant's three sets together.

Every change is one Lua script, so concurrent submitters and finishing jobs (several API
processes, workers, the MCP server, `webctx research`) can neither pass a cap together nor
publish a held job twice: the script that frees a slot moves the oldest held job into it
(ZPOPMIN) and returns it, and only the caller that got it back publishes it (`publish`;
one whose sending raises is held again, at the head).
A process with no publisher frees the slot only; the reconciler (`reconcile`, every
`WEBCTX_ADMISSION__TICK_S` on Celery beat) moves and publishes held jobs of every tenant with
free slots, lapsed slots included, so no job is held for ever. A held job that is cancelled
leaves the held set with its slot and is never published; every held job has its deadline
watchdog queued from its submission, so it ends by its deadline whatever happens here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import redis

from webctx.errors import TooManyJobs

if TYPE_CHECKING:
    from webctx.settings import Settings

logger = logging.getLogger(__name__)

HELD_TENANTS = "webctx:admission:held"
ALL_FRONT = "webctx:admission:front"

# KEYS: front, behind, held, tenants, all front. ARGV: now, lapses_at, job_id, running, queued,
# key_ttl_s, tenant. Returns {slot, front count, behind + held count}: slot 1 front, 2 waiting
# (behind or held), 0 refused.
_ADMIT = """
for i = 1, 3 do redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[1]) end
local front = redis.call('ZCARD', KEYS[1])
local waiting = redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3])
for i = 1, 3 do
  if redis.call('ZSCORE', KEYS[i], ARGV[3]) then return {math.min(i, 2), front, waiting} end
end
local slot = 0
if front < tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
  redis.call('ZADD', KEYS[5], ARGV[2], ARGV[7] .. '/' .. ARGV[3])
  redis.call('EXPIRE', KEYS[5], ARGV[6])
  front = front + 1
  slot = 1
elseif waiting < tonumber(ARGV[5]) then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
  waiting = waiting + 1
  slot = 2
end
for i = 1, 3 do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('EXPIRE', KEYS[i], ARGV[6]) end
end
return {slot, front, waiting}
"""

# KEYS: front, behind, held, tenants, all front. ARGV: now, job to free ('' none), job to hold,
# running (0: move none), tenant, key_ttl_s. Frees a slot, holds a recorded job, then moves
# the oldest held jobs into free front slots; returns the moved ones (each moved once only).
_SETTLE = """
if ARGV[2] ~= '' then
  for i = 1, 3 do redis.call('ZREM', KEYS[i], ARGV[2]) end
  redis.call('ZREM', KEYS[5], ARGV[5] .. '/' .. ARGV[2])
end
if ARGV[3] ~= '' then
  local score = redis.call('ZSCORE', KEYS[2], ARGV[3])
  if score then
    redis.call('ZREM', KEYS[2], ARGV[3])
    redis.call('ZADD', KEYS[3], score, ARGV[3])
    redis.call('EXPIRE', KEYS[3], ARGV[6])
    redis.call('SADD', KEYS[4], ARGV[5])
    redis.call('EXPIRE', KEYS[4], ARGV[6])
  end
end
for i = 1, 3 do redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[1]) end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[1])
local moved = {}
local running = tonumber(ARGV[4])
while running > 0 and redis.call('ZCARD', KEYS[1]) < running do
  local top = redis.call('ZPOPMIN', KEYS[3])
  if #top == 0 then break end
  redis.call('ZADD', KEYS[1], top[2], top[1])
  redis.call('EXPIRE', KEYS[1], ARGV[6])
  redis.call('ZADD', KEYS[5], top[2], ARGV[5] .. '/' .. top[1])
  redis.call('EXPIRE', KEYS[5], ARGV[6])
  table.insert(moved, top[1])
end
if redis.call('EXISTS', KEYS[3]) == 0 then redis.call('SREM', KEYS[4], ARGV[5]) end
return moved
"""

# KEYS: front, held, tenants, all front. ARGV: job, tenant, key_ttl_s. A moved job whose
# sending failed goes back to the head of the held jobs (its score is its age).
_REHOLD = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[2] .. '/' .. ARGV[1])
redis.call('ZADD', KEYS[2], score, ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('EXPIRE', KEYS[3], ARGV[3])
return 1
"""


class Slot(StrEnum):
    """Where an admitted job goes: to the workers, or waiting (held, or behind in the queues)."""

    FRONT = "front"
    BEHIND = "behind"
    HELD = "held"


@dataclass(frozen=True)
class Caps:
    """A tenant's caps: jobs at the front, jobs waiting, the retry hint, how long a slot is
    held at most (the job's deadline and a grace), and whether waiting jobs are held back
    (True) or published behind the front ones."""

    running: int
    queued: int
    retry_after_s: int
    lapse_s: float
    hold: bool = True


Publish = Callable[[str], None]
"""Sends a moved held job's first task (the worker layer's); must be cheap."""


class Admission:
    """The owner of the `front`, `behind` and `held` key families: admits jobs, holds them,
    releases their slots and publishes held jobs into freed ones (once `serve`d)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._admit = client.register_script(_ADMIT)
        self._settle = client.register_script(_SETTLE)
        self._rehold = client.register_script(_REHOLD)
        self._caps: Caps | None = None
        self._publish: Publish | None = None

    def serve(self, caps: Caps, publish: Publish) -> None:
        """Publish held jobs moved into slots this process frees (the processes that can
        send tasks: workers, the API)."""
        self._caps, self._publish = caps, publish

    def _keys(self, tenant: str) -> list[str]:
        base = f"webctx:tenant:{tenant}"
        return [f"{base}:front", f"{base}:behind", f"{base}:held", HELD_TENANTS, ALL_FRONT]

    def admit(self, tenant: str, job_id: str, caps: Caps) -> Slot:
        """Take a slot for the job (the same one again for a job already admitted), or
        raise TooManyJobs, taking nothing, when the tenant's unfinished jobs fill both caps.
        A HELD job must be recorded and then passed to `hold`."""
        now = time.time()
        args: list[str | int] = [f"{now:.6f}", f"{now + caps.lapse_s:.6f}", job_id,
                                 caps.running, caps.queued, int(caps.lapse_s) + 1,
                                 tenant]  # fmt: skip
        slot, front, waiting = self._admit(keys=self._keys(tenant), args=args)
        if int(slot) == 0:
            raise _refused(tenant, int(front) + int(waiting), caps)
        if int(slot) == 1:
            return Slot.FRONT
        return Slot.HELD if caps.hold else Slot.BEHIND

    def hold(self, tenant: str, job_id: str) -> list[str]:
        """Hold a recorded job admitted past `running` until a front slot frees (at once if
        one has); the held jobs this call published."""
        return self._run(tenant, free="", hold=job_id)

    def release(self, tenant: str, job_id: str) -> list[str]:
        """Free the job's slot (a finished job; a job refused after admission), moving the
        tenant's oldest held job into it; the held jobs this call published (one whose
        sending raised is held again, at the head)."""
        return self._run(tenant, free=job_id, hold="")

    def reconcile(self, caps: Caps, publish: Publish) -> list[str]:
        """Move and publish the held jobs of every tenant with free front slots (slots a
        process without a publisher freed, slots lapsed); idempotent."""
        moved: list[str] = []
        for tenant in sorted(self._redis.smembers(HELD_TENANTS)):
            moved += self._run(str(tenant), free="", hold="", caps=caps, publish=publish)
        return moved

    def _run(self, tenant: str, *, free: str, hold: str, caps: Caps | None = None,
             publish: Publish | None = None) -> list[str]:  # fmt: skip
        caps, publish = caps or self._caps, publish or self._publish
        running = caps.running if caps is not None and publish is not None else 0
        ttl = int(caps.lapse_s) + 1 if caps is not None else 7 * 24 * 3600
        args: list[str | int] = [f"{time.time():.6f}", free, hold, running, tenant, ttl]
        keys = self._keys(tenant)
        moved = [str(j) for j in self._settle(keys=keys, args=args)]
        sent = []
        for job_id in moved:
            try:
                assert publish is not None
                publish(job_id)
                sent.append(job_id)
            except Exception:  # held again: a later release or tick sends it
                logger.exception("held job not sent", extra={"job_id": job_id})
                self._rehold(keys=[keys[0], keys[2], keys[3], keys[4]], args=[job_id, tenant, ttl])
        return sent

    def counts(self, tenant: str) -> tuple[int, int]:
        """The tenant's (front, waiting) slots held now, lapsed ones not counted."""
        now = time.time()
        pipe = self._redis.pipeline()
        for key in self._keys(tenant)[:3]:
            pipe.zcount(key, f"({now:.3f}", "+inf")
        front, behind, held = pipe.execute()
        return int(front), int(behind) + int(held)

    def interactive_besides(self, tenant: str) -> int:
        """How many front jobs (sent to the workers, unfinished) other tenants have now."""
        now = f"({time.time():.6f}"
        members = self._redis.zrangebyscore(ALL_FRONT, now, "+inf")
        return sum(1 for m in members if str(m).rsplit("/", 1)[0] != tenant)

    def held(self, tenant: str) -> list[str]:
        """The tenant's held jobs, oldest first."""
        return [str(j) for j in self._redis.zrange(self._keys(tenant)[2], 0, -1)]


def admission_caps(settings: Settings) -> Caps:
    """A tenant's admission caps under `settings` (WEBCTX_ADMISSION__*)."""
    cfg = settings.admission
    return Caps(running=cfg.running, queued=cfg.queued, retry_after_s=cfg.retry_after_s,
                lapse_s=settings.job_timeout_s + cfg.hold_s, hold=cfg.hold)  # fmt: skip


def _refused(tenant: str, unfinished: int, caps: Caps) -> TooManyJobs:
    return TooManyJobs(
        f"tenant {tenant!r} has {unfinished} unfinished jobs, its cap "
        f"(WEBCTX_ADMISSION__RUNNING={caps.running} plus WEBCTX_ADMISSION__QUEUED="
        f"{caps.queued}): retry in {caps.retry_after_s} s, once one of them has finished",
        retry_after_s=caps.retry_after_s,
        unfinished=unfinished,
    )
