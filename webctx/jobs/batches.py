"""Batches: many questions submitted at once, each run as an ordinary job, fed gradually.

A batch record lives in Redis beside the jobs; item `i` runs as job `<batch_id>-<i>`:

    webctx:batch:<id>            hash  name, tenant, file_sha, state, total, cursor, created_at,
                                       started_at, finished_at, done, failed, cancelled
    webctx:batch:<id>:items      hash  i -> {"id", "request"}      (input order by index)
    webctx:batch:<id>:inflight   hash  i -> time it was fed
    webctx:batch:<id>:outcome    hash  i -> s (succeeded) | f (failed) | c (cancelled)
    webctx:batch:<id>:requeue    set   items whose job state vanished: feed them again
    webctx:batch:<id>:stats      hash  summed job counters, failures by reason
    webctx:batchname:<tenant>:<sha(name)>   the batch id of a name (resubmission)
    webctx:batches:running       set   batch ids still feeding (fair shares)
    webctx:tenant:<tenant>:batches  zset  the tenant's batch ids -> when created + TTL
                                       (ids by prefix: webctx.jobs.refs)

`feed` is the one step that moves a batch: under a short lock it settles finished
in-flight items, then starts as many new ones as the batch, its tenant's share and the
global cap allow. It is idempotent, so anything may call it at any time (an item's end,
a periodic tick, a status read); a lost message therefore delays a batch, never stalls
it, and an in-flight job past its deadline (its watchdog lost too) is failed here.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from webctx.errors import BatchConflict, BatchNotFound, JobNotFound
from webctx.jobs.batch_items import BatchItem, batch_of_job, item_job_id, items_sha
from webctx.jobs.refs import live_with_prefix, pick
from webctx.jobs.store import JobStore
from webctx.models import JobRequest, JobStatus

_RUNNING = "webctx:batches:running"
_LOCK_MS = 60_000
"""The feeder's lock (one feed step or cancel at a time) expires after this, should its
holder die."""
_FINISHED = (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value)
_STAT_NAMES = (
    "pages_downloaded", "pages_reused", "pages_revalidated", "searches_sent", "searches_cached",
    "chunks", "chunks_already_stored", "embed_requests", "tokens_embedded", "cache_hits",
    "tokens_saved", "index_reused", "pages_stale",
)  # fmt: skip


@dataclass(frozen=True)
class FeedLimits:
    """How many items may be in flight: per batch, and across all batches."""

    concurrency: int = 4
    max_inflight: int = 16
    beside_interactive: int = 1  # per batch, while other tenants' interactive jobs run
    job_timeout_s: float = 600.0
    grace_s: float = 60.0


@dataclass
class BatchStatus:
    """A batch's counts and accounting, as `webctx batch status` prints it."""

    id: str
    name: str
    state: str
    total: int
    queued: int
    running: int
    done: int
    failed: int
    cancelled: int
    started_at: float | None
    finished_at: float | None
    eta_s: float | None
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """True once no item will run any more."""
        return self.state in ("finished", "cancelled") and self.running == 0

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of the status."""
        return dict(self.__dict__)


Submit = Callable[[str, JobRequest], None]
"""Start job `job_id` for a request (the Celery layer's submit_job, bound to a batch)."""


class BatchStore:
    """Batch records in the job store's Redis; jobs themselves stay in the JobStore."""

    def __init__(self, client: redis.Redis, jobs: JobStore) -> None:
        self._redis = client
        self.jobs = jobs
        self.ttl_s = jobs.ttl_s

    def _k(self, batch_id: str, part: str = "") -> str:
        return f"webctx:batch:{batch_id}" + (f":{part}" if part else "")

    def _expire(self, pipe: Any, batch_id: str) -> None:
        for part in ("", "items", "inflight", "outcome", "requeue", "stats"):
            pipe.expire(self._k(batch_id, part), self.ttl_s)

    # -- submission ---------------------------------------------------------------------
    def create(self, tenant: str, name: str, items: Sequence[BatchItem]) -> tuple[str, bool]:
        """The batch for (tenant, name): new, or the existing one if its items are the same.

        Returns (batch id, True if created). BatchConflict if the name holds other items.
        """
        sha = items_sha(items)
        name_key = f"webctx:batchname:{tenant}:{hashlib.sha256(name.encode()).hexdigest()}"
        batch_id = uuid.uuid4().hex
        if not self._redis.set(name_key, batch_id, nx=True, ex=self.ttl_s):
            existing = cast(str, self._redis.get(name_key))
            their_sha = self._redis.hget(self._k(existing), "file_sha")
            if their_sha is None:  # expired record, or its creator is writing it now
                time.sleep(0.2)
                their_sha = self._redis.hget(self._k(existing), "file_sha")
            if their_sha is not None and their_sha != sha:
                raise BatchConflict(
                    f"batch name {name!r} is already used by batch {existing} with a "
                    "different file: choose another name"
                )
            if their_sha is not None:
                return existing, False
            self._redis.set(name_key, batch_id, ex=self.ttl_s)
        self._write(batch_id, tenant, name, sha, items)
        return batch_id, True

    def _write(
        self, batch_id: str, tenant: str, name: str, sha: str, items: Sequence[BatchItem]
    ) -> None:
        pipe = self._redis.pipeline()
        for start in range(0, len(items), 1000):
            chunk = {
                str(i): json.dumps({"id": it.id, "request": it.request.model_dump()})
                for i, it in enumerate(items[start : start + 1000], start=start)
            }
            pipe.hset(self._k(batch_id, "items"), mapping=cast(dict[Any, Any], chunk))
        # The meta hash last: a batch with file_sha is complete.
        meta: dict[Any, Any] = {
            "name": name, "tenant": tenant, "file_sha": sha, "state": "running",
            "total": len(items), "cursor": 0, "created_at": f"{time.time():.3f}",
            "done": 0, "failed": 0, "cancelled": 0,
        }  # fmt: skip
        pipe.hset(self._k(batch_id), mapping=meta)
        pipe.sadd(_RUNNING, batch_id)
        self._expire(pipe, batch_id)
        # A batch's records outlive this entry only while it keeps writing past its TTL:
        # then its full id still names it.
        index, now = self._index(tenant), time.time()
        pipe.zadd(index, {batch_id: now + self.ttl_s})
        pipe.zremrangebyscore(index, "-inf", now)
        pipe.expire(index, self.ttl_s)
        pipe.execute()

    def _index(self, tenant: str) -> str:
        return f"webctx:tenant:{tenant}:batches"

    def resolve(self, tenant: str, ref: str) -> str:
        """The batch `ref` names: its full id, or a unique prefix of one of the tenant's
        batches' ids (webctx.jobs.refs.pick: BatchNotFound, or InvalidRequest)."""
        index = self._index(tenant)
        return pick(
            "batch",
            ref,
            exists=lambda b: bool(self._redis.hexists(self._k(b), "file_sha")),
            with_prefix=lambda p: live_with_prefix(self._redis, index, p),
            not_found=BatchNotFound,
        )

    # -- reading ------------------------------------------------------------------------
    def meta(self, batch_id: str) -> dict[str, str]:
        """The batch's meta fields, or BatchNotFound."""
        raw = cast(dict[str, str], self._redis.hgetall(self._k(batch_id)))
        if "file_sha" not in raw:
            raise BatchNotFound(batch_id)
        return raw

    def tenant(self, batch_id: str) -> str:
        """The tenant owning the batch, or BatchNotFound."""
        return self.meta(batch_id)["tenant"]

    def item(self, batch_id: str, index: int) -> BatchItem:
        """Item `index` of the batch."""
        raw = self._redis.hget(self._k(batch_id, "items"), str(index))
        if raw is None:
            raise BatchNotFound(batch_id)
        data = json.loads(cast(str, raw))
        return BatchItem(id=data["id"], request=JobRequest.model_validate(data["request"]))

    def status(
        self, batch_id: str, *, price_per_1k_tokens: float = 0.0, now: float | None = None
    ) -> BatchStatus:
        """Counts, ETA and accounting of the batch."""
        now = now if now is not None else time.time()
        meta = self.meta(batch_id)
        total, done = int(meta["total"]), int(meta["done"])
        failed, cancelled = int(meta["failed"]), int(meta["cancelled"])
        running = int(self._redis.hlen(self._k(batch_id, "inflight")))
        started = float(meta["started_at"]) if "started_at" in meta else None
        finished_at = float(meta["finished_at"]) if "finished_at" in meta else None
        left = total - done - failed - cancelled
        ended = done + failed
        eta: float | None = None
        if started is not None and ended and left and meta["state"] == "running":
            eta = round(left * (now - started) / ended, 1)
        elif left == 0 or meta["state"] != "running":
            eta = 0.0
        stats = self._stats(batch_id, price_per_1k_tokens, ranked=done)
        stats["elapsed_s"] = round((finished_at or now) - started, 3) if started else 0.0
        return BatchStatus(
            id=batch_id, name=meta["name"], state=meta["state"], total=total,
            queued=max(0, left - running), running=running, done=done, failed=failed,
            cancelled=cancelled, started_at=started, finished_at=finished_at, eta_s=eta,
            stats=stats,
        )  # fmt: skip

    def _stats(self, batch_id: str, price_per_1k_tokens: float, *, ranked: int) -> dict[str, Any]:
        raw = cast(dict[str, str], self._redis.hgetall(self._k(batch_id, "stats")))
        counts = {name: int(raw.get(name, 0)) for name in _STAT_NAMES}
        pages = counts["pages_downloaded"] + counts["pages_reused"] + counts["pages_revalidated"]
        searches = counts["searches_sent"] + counts["searches_cached"]
        # Texts looked up in the embedding cache: chunks of pages not already stored, and
        # each ranked item's question.
        lookups = counts["chunks"] - counts["chunks_already_stored"] + ranked
        return {
            **counts,
            "failures_by_reason": {
                k.partition(":")[2]: int(v) for k, v in raw.items() if k.startswith("reason:")
            },
            "item_failures_by_stage": {
                k.partition(":")[2]: int(v) for k, v in raw.items() if k.startswith("stage:")
            },
            "page_reuse_rate": round(counts["pages_reused"] / pages, 3) if pages else 0.0,
            "search_cache_hit_rate": round(counts["searches_cached"] / searches, 3)
            if searches
            else 0.0,  # fmt: skip
            "embed_cache_hit_rate": round(min(1.0, counts["cache_hits"] / lookups), 3)
            if lookups
            else 0.0,  # fmt: skip
            "cost_usd": round(counts["tokens_embedded"] / 1000 * price_per_1k_tokens, 6),
        }

    def results(self, batch_id: str) -> Iterator[dict[str, Any]]:
        """One record per finished item, in input order: {id, bundle} or {id, error}."""
        total = int(self.meta(batch_id)["total"])
        for start in range(0, total, 500):
            indexes = [str(i) for i in range(start, min(total, start + 500))]
            outcomes = self._redis.hmget(self._k(batch_id, "outcome"), indexes)
            for index, outcome in zip(indexes, outcomes, strict=True):
                if outcome in ("s", "f"):
                    record = self._result(batch_id, int(index))
                    if record is not None:
                        yield record

    def _result(self, batch_id: str, index: int) -> dict[str, Any] | None:
        item = self.item(batch_id, index)
        job_id = item_job_id(batch_id, index)
        try:
            progress = self.jobs.progress(job_id)
        except JobNotFound:
            return {"id": item.id, "error": {"stage": "expired", "message": "job expired"}}
        bundle = self.jobs.bundle(job_id)
        if progress.status is JobStatus.SUCCEEDED and bundle is not None:
            return {"id": item.id, "bundle": bundle.model_dump(mode="json")}
        stage = error_stage(progress.status, progress.error)
        return {"id": item.id, "error": {"stage": stage, "message": progress.error or stage}}

    # -- moving ---------------------------------------------------------------------------
    def feed(
        self, batch_id: str, submit: Submit, limits: FeedLimits, *, now: float | None = None
    ) -> int:
        """Settle finished items and start new ones within the limits; returns how many
        started. Safe to call concurrently and repeatedly (one feeder at a time per batch)."""
        lock, token = self._k(batch_id, "lock"), uuid.uuid4().hex
        if not self._redis.set(lock, token, nx=True, px=_LOCK_MS):
            return 0  # another feeder is at it; it sees everything this call would
        try:
            now = now if now is not None else time.time()
            meta = self.meta(batch_id)
            self._settle(batch_id, limits, now)
            if meta["state"] != "running":
                self._redis.srem(_RUNNING, batch_id)
                return 0
            slots = self._slots(batch_id, meta["tenant"], limits)
            started = 0
            for index in self._next_items(batch_id, int(meta["total"]), slots):
                with self._redis.pipeline() as pipe:
                    pipe.hset(self._k(batch_id, "inflight"), str(index), f"{now:.3f}")
                    pipe.hsetnx(self._k(batch_id), "started_at", f"{now:.3f}")
                    self._expire(pipe, batch_id)
                    pipe.execute()
                submit(item_job_id(batch_id, index), self.item(batch_id, index).request)
                started += 1
            self._maybe_finish(batch_id)
            return started
        finally:
            self._release(lock, token)

    def _release(self, lock: str, token: str) -> None:
        """Delete the lock if it is still ours (WATCH: no Lua, so fakeredis works too)."""
        with self._redis.pipeline() as pipe:
            try:
                pipe.watch(lock)  # type: ignore[no-untyped-call]
                if pipe.get(lock) == token:
                    pipe.multi()
                    pipe.delete(lock)
                    pipe.execute()
            except redis.WatchError:
                pass  # it expired and someone else holds it now

    def _settle(self, batch_id: str, limits: FeedLimits, now: float) -> None:
        inflight = cast(dict[str, str], self._redis.hgetall(self._k(batch_id, "inflight")))
        for index, fed_at in inflight.items():
            job_id = item_job_id(batch_id, int(index))
            try:
                status = self.jobs.status(job_id)
            except JobNotFound:
                if now - float(fed_at) > limits.grace_s:  # its feeder died, or Redis lost it
                    pipe = self._redis.pipeline()
                    pipe.hdel(self._k(batch_id, "inflight"), index)
                    pipe.sadd(self._k(batch_id, "requeue"), index)
                    self._expire(pipe, batch_id)
                    pipe.execute()
                continue
            if status.value not in _FINISHED:
                if now - float(fed_at) > limits.job_timeout_s + limits.grace_s:
                    # Its watchdog was lost with its other messages: end it here.
                    error = "deadline passed without a result (messages lost)"
                    self.jobs.set_status(job_id, JobStatus.FAILED, error=error)
                    status = JobStatus.FAILED
                else:
                    continue
            self._record_outcome(batch_id, int(index), status)

    def _record_outcome(self, batch_id: str, index: int, status: JobStatus) -> None:
        outcome = {"succeeded": "s", "failed": "f", "cancelled": "c"}[status.value]
        job_id = item_job_id(batch_id, index)
        if self._redis.hsetnx(self._k(batch_id, "outcome"), str(index), outcome):
            counter = {"s": "done", "f": "failed", "c": "cancelled"}[outcome]
            pipe = self._redis.pipeline()
            pipe.hincrby(self._k(batch_id), counter, 1)
            stats = self._k(batch_id, "stats")
            counters = self.jobs.counters(job_id)
            for name in _STAT_NAMES:
                if counters.get(name):
                    pipe.hincrby(stats, name, counters[name])
            for failure in self.jobs.failures(job_id):
                pipe.hincrby(stats, f"reason:{failure.reason}", 1)
            if outcome == "f":
                error = self.jobs.error(job_id)
                pipe.hincrby(stats, f"stage:{error_stage(status, error)}", 1)
            self._expire(pipe, batch_id)  # the parts written since creation expire too
            pipe.execute()
        self._redis.hdel(self._k(batch_id, "inflight"), str(index))

    def _slots(self, batch_id: str, tenant: str, limits: FeedLimits) -> int:
        """Free slots: the batch's own cap (lower while other tenants' interactive jobs
        run), its tenant's fair share, the global cap."""
        per_tenant: dict[str, int] = {}
        total = 0
        for other in cast(set[str], self._redis.smembers(_RUNNING)):
            owner = cast("str | None", self._redis.hget(self._k(other), "tenant"))
            if owner is None:
                self._redis.srem(_RUNNING, other)
                continue
            count = int(self._redis.hlen(self._k(other, "inflight")))
            per_tenant[owner] = per_tenant.get(owner, 0) + count
            total += count
        per_tenant.setdefault(tenant, 0)
        share = max(1, limits.max_inflight // len(per_tenant))
        mine = int(self._redis.hlen(self._k(batch_id, "inflight")))
        own = limits.concurrency
        if self.jobs.admission.interactive_besides(tenant):  # they keep their latency
            own = min(own, limits.beside_interactive)
        return max(
            0,
            min(
                own - mine,
                share - per_tenant[tenant],
                limits.max_inflight - total,
            ),
        )

    def _next_items(self, batch_id: str, total: int, slots: int) -> Iterator[int]:
        for _ in range(slots):
            again = self._redis.spop(self._k(batch_id, "requeue"))
            if again is not None:
                yield int(cast(str, again))
                continue
            index = int(self._redis.hincrby(self._k(batch_id), "cursor", 1)) - 1
            if index >= total:
                self._redis.hincrby(self._k(batch_id), "cursor", -1)
                return
            yield index

    def _maybe_finish(self, batch_id: str) -> None:
        meta = self.meta(batch_id)
        ended = int(meta["done"]) + int(meta["failed"]) + int(meta["cancelled"])
        if meta["state"] == "running" and ended >= int(meta["total"]):
            pipe = self._redis.pipeline()
            pipe.hset(self._k(batch_id), mapping={"state": "finished",
                                                  "finished_at": f"{time.time():.3f}"})  # fmt: skip
            pipe.srem(_RUNNING, batch_id)
            pipe.execute()

    def cancel(self, batch_id: str) -> None:
        """Stop the batch: queued items never start, in-flight jobs are cancelled.

        It holds the feeder's lock: a feed step running meanwhile could start an item this
        cancel counts as never started (the item then counted twice, cancelled and done)."""
        lock, token = self._k(batch_id, "lock"), uuid.uuid4().hex
        while not self._redis.set(lock, token, nx=True, px=_LOCK_MS):
            time.sleep(0.05)  # a feed step takes milliseconds; a dead feeder's lock expires
        try:
            self._cancel(batch_id)
        finally:
            self._release(lock, token)

    def _cancel(self, batch_id: str) -> None:
        meta = self.meta(batch_id)
        if meta["state"] != "running":
            return
        pipe = self._redis.pipeline()
        pipe.hset(self._k(batch_id), mapping={"state": "cancelled",
                                              "finished_at": f"{time.time():.3f}"})  # fmt: skip
        pipe.srem(_RUNNING, batch_id)
        pipe.execute()
        for index in cast(list[str], self._redis.hkeys(self._k(batch_id, "inflight"))):
            job_id = item_job_id(batch_id, int(index))
            self.jobs.set_status(job_id, JobStatus.CANCELLED, error="batch cancelled")
        cursor = int(self._redis.hget(self._k(batch_id), "cursor") or 0)
        never_started = (
            int(meta["total"]) - cursor + int(self._redis.scard(self._k(batch_id, "requeue")))
        )
        self._redis.hincrby(self._k(batch_id), "cancelled", never_started)

    def running_batches(self) -> list[str]:
        """Ids of batches still feeding."""
        return sorted(cast(set[str], self._redis.smembers(_RUNNING)))

    def claim_tick(self, batch_id: str, *, every_s: float) -> bool:
        """True at most once per `every_s`: whoever gets it schedules the next tick.

        The claim lapses a little before the tick it scheduled runs, so that tick claims
        again and the chain goes on; a second chain started meanwhile (an item's end
        found the claim lapsed) dies at its first failed claim.
        """
        key = self._k(batch_id, "tick")
        return bool(self._redis.set(key, "1", nx=True, px=max(1, int(every_s * 800))))


def error_stage(status: JobStatus, error: str | None) -> str:
    """The stage a failed item's error points at, for results and accounting."""
    text = (error or "").lower()
    if status is JobStatus.CANCELLED or "cancelled" in text:
        return "cancelled"
    if text.startswith("rank:"):
        return "rank"
    if "deadline" in text:
        return "deadline"
    if "search" in text:
        return "search"
    if "sources failed" in text:
        return "fetch"
    return "job"


class FeedOnItemEnd:
    """A JobObserver: when a batch item's job ends, feed its batch now (`feed(batch_id)`,
    the worker layer's prompt `webctx.batch_feed`) instead of at the batch's next tick."""

    def __init__(self, feed: Callable[[str], None]) -> None:
        self.feed = feed

    def job_event(self, event: str, job_id: str, facts: Mapping[str, Any]) -> None:
        """Feed the batch of an ended batch item."""
        if event != "status" or facts.get("status") not in _FINISHED:
            return
        batch_id = batch_of_job(job_id)
        if batch_id is not None:
            self.feed(batch_id)
