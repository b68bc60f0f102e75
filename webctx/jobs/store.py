"""Job state in Redis: the request, fan-out bookkeeping, pages, failures, the bundle.

Tasks pass job and URL ids; everything they need to hand on lives here. Each fan-out
step records completion in a set, so a redelivered task never counts twice, and the
task whose completion fills the set starts the next stage (no chords: a chord's body waits
for every header result, and one lost message would stall the job: webctx/jobs/fanin.py).
Every key of a job expires `ttl_s` after its last write.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

import redis

from webctx.errors import JobNotFound
from webctx.jobs.admission import Admission
from webctx.jobs.quota import StoredBytes
from webctx.jobs.round_store import RoundStore
from webctx.jobs.tenant_pages import TenantPages
from webctx.models import Bundle, Failure, JobRequest, JobStatus, Page, Retrieval, SearchResult

Step = Literal["search", "fetch", "embed"]


def url_id_for(url: str) -> str:
    """A stable short id for a (normalised) URL."""
    return hashlib.sha256(url.encode()).hexdigest()[:20]


@dataclass
class JobProgress:
    """A snapshot of a job for progress displays and status endpoints."""

    job_id: str
    status: JobStatus
    error: str | None = None
    reason: str | None = None
    """Why the job failed as a whole (`provider_down`), when not because of its pages."""
    queries: int = 0
    searched: int = 0
    urls: int = 0
    fetched: int = 0
    failed: int = 0
    embedded: int = 0
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """True once the job can change no more."""
        return self.status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class JobObserver(Protocol):
    """Told of each fact a JobStore records (metrics): `status`, `page`, `failure`, `counts`."""

    def job_event(self, event: str, job_id: str, facts: Mapping[str, Any]) -> None:
        """Called after the fact is written; must not raise (errors are ignored)."""


class JobStore:
    """All job state, in one Redis database (a real server or fakeredis).

    `observers` are told of each fact recorded (metrics, the batch feeder): the process
    that builds the store chooses them (the worker's app, the API's runtime)."""

    def __init__(
        self, client: redis.Redis, *, ttl_s: int = 7 * 24 * 3600,
        observers: Sequence[JobObserver] = (),
    ) -> None:  # fmt: skip
        self._redis = client
        self.ttl_s = ttl_s
        self.observers = tuple(observers)
        self.stored = StoredBytes(client, ttl_s=ttl_s)
        self.admission = Admission(client)
        self.tenant_pages = TenantPages(client, ttl_s=ttl_s)
        self.rounds = RoundStore(client, self._k, ttl_s=ttl_s)

    def _emit(self, event: str, job_id: str, facts: Mapping[str, Any]) -> None:
        for observer in self.observers:
            try:
                observer.job_event(event, job_id, facts)
            except Exception:  # an observer never breaks job state
                pass

    def ping(self) -> bool:
        """True if the state Redis answers (readiness probes)."""
        return bool(self._redis.ping())

    def close(self) -> None:
        """Close the connection pool (the process is done with the state Redis)."""
        self._redis.close()

    # -- keys -------------------------------------------------------------------------------
    def _k(self, job_id: str, part: str) -> str:
        return f"webctx:job:{job_id}:{part}"

    def _page_key(self, content_sha256: str) -> str:
        return f"webctx:page:{content_sha256}"

    def _expire(self, pipe: Any, *keys: str) -> None:
        for key in keys:
            pipe.expire(key, self.ttl_s)

    # -- lifecycle --------------------------------------------------------------------------
    def create(
        self,
        request: JobRequest,
        *,
        job_id: str | None = None,
        tenant: str | None = None,
        batch: str | None = None,
        max_stored_bytes: int = 0,
    ) -> str:
        """Record a new queued job (owned by `tenant`, part of `batch`, if given); its id.

        The request's bytes count to the tenant's stored bytes; QuotaExceeded (nothing
        recorded) if they would pass `max_stored_bytes` (0: no limit)."""
        job_id = job_id or uuid.uuid4().hex
        meta = self._k(job_id, "meta")
        raw = request.model_dump_json()
        if tenant is not None:
            self.stored.add(tenant, job_id, len(raw.encode()), limit=max_stored_bytes)
        pipe = self._redis.pipeline()
        fields: dict[Any, Any] = {
            "request": raw,
            "status": JobStatus.QUEUED.value,
            "created_at": f"{time.time():.3f}",
        }
        if tenant is not None:
            fields["tenant"] = tenant
        if batch is not None:
            fields["batch"] = batch
        pipe.hset(meta, mapping=fields)
        self._expire(pipe, meta)
        pipe.execute()
        self._emit("status", job_id, {"status": JobStatus.QUEUED.value})
        return job_id

    def tenant(self, job_id: str) -> str | None:
        """The tenant owning the job (None for jobs submitted without one), or JobNotFound."""
        meta = self._k(job_id, "meta")
        owner, status = self._redis.hmget(meta, ["tenant", "status"])
        if status is None:
            raise JobNotFound(job_id)
        return cast("str | None", owner)

    def batch_of(self, job_id: str) -> str | None:
        """The batch the job is an item of (None for interactive jobs)."""
        return cast("str | None", self._redis.hget(self._k(job_id, "meta"), "batch"))

    def claim_idempotency_key(self, tenant: str, key: str, job_id: str) -> str:
        """Bind a client's Idempotency-Key to `job_id` (SET NX); returns the job it names.

        The first caller's `job_id` comes back to every later caller with the same key,
        for as long as the jobs live. Keys are per tenant, hashed so any string is safe.
        """
        digest = hashlib.sha256(key.encode()).hexdigest()
        name = f"webctx:idem:{tenant}:{digest}"
        if self._redis.set(name, job_id, nx=True, ex=self.ttl_s):
            return job_id
        existing = self._redis.get(name)
        return cast(str, existing) if existing else job_id

    def release_idempotency_key(self, tenant: str, key: str, job_id: str) -> None:
        """Unbind the key if it still names `job_id` (a job that was refused, never made)."""
        name = f"webctx:idem:{tenant}:{hashlib.sha256(key.encode()).hexdigest()}"
        if self._redis.get(name) == job_id:
            self._redis.delete(name)

    def tenant_page(self, tenant: str, ref: str) -> Page | None:
        """A page one of the tenant's jobs fetched, by content hash or by URL."""
        sha = self.tenant_pages.sha_of(tenant, ref)
        return self.page(sha) if sha else None

    def exists(self, job_id: str) -> bool:
        """True if the job is known (and not expired)."""
        return bool(self._redis.exists(self._k(job_id, "meta")))

    def request(self, job_id: str) -> JobRequest:
        """The job's request, or JobNotFound."""
        raw = self._redis.hget(self._k(job_id, "meta"), "request")
        if raw is None:
            raise JobNotFound(job_id)
        return JobRequest.model_validate_json(cast(str, raw))

    def status(self, job_id: str) -> JobStatus:
        """The job's lifecycle state, or JobNotFound."""
        raw = self._redis.hget(self._k(job_id, "meta"), "status")
        if raw is None:
            raise JobNotFound(job_id)
        return JobStatus(cast(str, raw))

    def set_status(
        self, job_id: str, status: JobStatus, *, error: str | None = None, reason: str = ""
    ) -> None:
        """Move the job to `status` (`reason`: why it failed as a whole, e.g. provider_down);
        a finished job never moves again."""
        meta = self._k(job_id, "meta")
        current, tenant = self._redis.hmget(meta, ["status", "tenant"])
        if current in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
            return
        mapping: dict[Any, Any] = {"status": status.value}
        if error:
            mapping["error"] = error
        if reason:
            mapping["reason"] = reason
        finished = status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
        if finished:
            mapping["finished_at"] = f"{time.time():.3f}"
        pipe = self._redis.pipeline()
        pipe.hset(meta, mapping=mapping)
        if finished:  # wakes `wait_finished` at once instead of at its next poll
            signal = self._k(job_id, "finished")
            pipe.rpush(signal, status.value)
            self._expire(pipe, signal)
        pipe.execute()
        if finished and tenant is not None:  # its admission slot is free for the next job
            self.admission.release(cast(str, tenant), job_id)
        if current != status.value:
            self._emit("status", job_id, {"status": status.value})

    def wait_finished(self, job_id: str, timeout_s: float) -> bool:
        """Block until the job finishes, at most `timeout_s`; True if it has. Any number of
        clients may wait on one job (the signal is rotated in place, never taken), so a
        client returns as soon as the job ends rather than at its next poll."""
        signal = self._k(job_id, "finished")
        # Redis takes a fractional timeout (6.0+); redis-py's stubs say int.
        moved = self._redis.blmove(signal, signal, timeout_s, "RIGHT", "LEFT")  # type: ignore[arg-type]
        return moved is not None

    def error(self, job_id: str) -> str | None:
        """Why the job failed (or was cancelled), if it says."""
        return cast("str | None", self._redis.hget(self._k(job_id, "meta"), "error"))

    def is_active(self, job_id: str) -> bool:
        """False once the job finished, was cancelled, or expired: tasks then do nothing."""
        raw = self._redis.hget(self._k(job_id, "meta"), "status")
        return raw in (JobStatus.QUEUED.value, JobStatus.RUNNING.value)

    # -- plan and search --------------------------------------------------------------------
    def set_queries(self, job_id: str, queries: Sequence[str], facets: Sequence[str] = ()) -> None:
        """Record the plan: its search queries and the question's facets, together."""
        plan = {"queries": json.dumps(list(queries)), "facets": json.dumps(list(facets))}
        self._redis.hset(self._k(job_id, "meta"), mapping=cast("dict[Any, str]", plan))

    def queries(self, job_id: str, part: Literal["queries", "facets"] = "queries") -> list[str]:
        """The planned search queries, or facets (empty before planning)."""
        raw = self._redis.hget(self._k(job_id, "meta"), part)
        return list(json.loads(cast(str, raw))) if raw else []

    def save_search(self, job_id: str, query_idx: int, results: Sequence[SearchResult]) -> None:
        """Store one query's results (idempotent: a rerun overwrites)."""
        key = self._k(job_id, "search")
        payload = json.dumps([r.model_dump() for r in results])
        pipe = self._redis.pipeline()
        pipe.hset(key, str(query_idx), payload)
        self._expire(pipe, key)
        pipe.execute()

    def search_results(self, job_id: str) -> list[list[SearchResult]]:
        """Every stored query's results, in query order."""
        raw = cast(dict[str, str], self._redis.hgetall(self._k(job_id, "search")))
        return [
            [SearchResult.model_validate(item) for item in json.loads(raw[idx])]
            for idx in sorted(raw, key=int)
        ]

    # -- URLs and pages ---------------------------------------------------------------------
    def set_urls(self, job_id: str, urls: Sequence[str]) -> dict[str, str]:
        """Record the URLs chosen for fetching; returns url_id -> url."""
        mapping = {url_id_for(u): u for u in urls}
        key = self._k(job_id, "urls")
        pipe = self._redis.pipeline()
        pipe.delete(key)
        if mapping:
            pipe.hset(key, mapping=cast(dict[Any, Any], mapping))
        self._expire(pipe, key)
        pipe.execute()
        return mapping

    def urls(self, job_id: str) -> dict[str, str]:
        """url_id -> url of the job's chosen sources."""
        return cast(dict[str, str], self._redis.hgetall(self._k(job_id, "urls")))

    def url(self, job_id: str, url_id: str) -> str:
        """One chosen URL by id."""
        raw = self._redis.hget(self._k(job_id, "urls"), url_id)
        if raw is None:
            raise JobNotFound(job_id)
        return cast(str, raw)

    def save_page(
        self, job_id: str, url_id: str, page: Page, retrieval: Retrieval | None = None
    ) -> str:
        """Store a page under its content hash and link it to the job (with how the job
        got it, if given); returns the hash."""
        page_key = self._page_key(page.content_sha256)
        link = self._k(job_id, "pages")
        tenant = cast("str | None", self._redis.hget(self._k(job_id, "meta"), "tenant"))
        pipe = self._redis.pipeline()
        pipe.set(page_key, page.model_dump_json(), ex=self.ttl_s)
        pipe.hset(link, url_id, page.content_sha256)
        self._expire(pipe, link)
        if retrieval is not None:  # per job: the page record is shared by every job
            retrieved = self._k(job_id, "retrieved")
            pipe.hset(retrieved, page.content_sha256, retrieval.model_dump_json())
            self._expire(pipe, retrieved)
        if tenant:  # get_source never sees a page only another tenant's jobs fetched
            self.tenant_pages.link(pipe, tenant, page)
        pipe.execute()
        self._emit("page", job_id, {"url_id": url_id})
        return page.content_sha256

    def page(self, content_sha256: str) -> Page | None:
        """A stored page by content hash."""
        raw = self._redis.get(self._page_key(content_sha256))
        return Page.model_validate_json(cast(str, raw)) if raw else None

    def page_for(self, job_id: str, url_id: str) -> Page | None:
        """The page fetched for one of the job's URLs."""
        sha = self._redis.hget(self._k(job_id, "pages"), url_id)
        return self.page(cast(str, sha)) if sha else None

    def pages(self, job_id: str) -> dict[str, Page]:
        """content_sha256 -> Page for every page of the job that is still embedded-ready."""
        links = cast(dict[str, str], self._redis.hgetall(self._k(job_id, "pages")))
        failed = set(cast(list[str], self._redis.hkeys(self._k(job_id, "failures"))))
        out: dict[str, Page] = {}
        for url_id, sha in links.items():
            if url_id in failed:
                continue
            page = self.page(sha)
            if page is not None:
                out.setdefault(sha, page)
        return out

    def retrievals(self, job_id: str) -> dict[str, Retrieval]:
        """content_sha256 -> how the job got that page (where from, when confirmed)."""
        raw = cast(dict[str, str], self._redis.hgetall(self._k(job_id, "retrieved")))
        return {sha: Retrieval.model_validate_json(value) for sha, value in raw.items()}

    # -- failures and counters --------------------------------------------------------------
    def add_failure(self, job_id: str, key: str, failure: Failure) -> None:
        """Record why a source (or query) failed; one record per key."""
        name = self._k(job_id, "failures")
        pipe = self._redis.pipeline()
        pipe.hset(name, key, failure.model_dump_json())
        self._expire(pipe, name)
        pipe.execute()
        self._emit("failure", job_id, {"stage": failure.stage, "reason": failure.reason})

    def failures(self, job_id: str) -> list[Failure]:
        """Every recorded failure."""
        raw = cast(dict[str, str], self._redis.hgetall(self._k(job_id, "failures")))
        return [Failure.model_validate_json(v) for _, v in sorted(raw.items())]

    def add_counts(self, job_id: str, **deltas: int) -> None:
        """Increment named counters (requests, tokens, chunks...)."""
        key = self._k(job_id, "counters")
        pipe = self._redis.pipeline()
        for name, delta in deltas.items():
            pipe.hincrby(key, name, delta)
        self._expire(pipe, key)
        pipe.execute()
        self._emit("counts", job_id, deltas)

    def set_count(self, job_id: str, name: str, value: int) -> None:
        """Set a counter outright (for facts a redelivered task may record twice)."""
        key = self._k(job_id, "counters")
        self._redis.hset(key, name, value)
        self._redis.expire(key, self.ttl_s)

    def counters(self, job_id: str) -> dict[str, int]:
        """All counters of the job."""
        raw = cast(dict[str, str], self._redis.hgetall(self._k(job_id, "counters")))
        return {k: int(v) for k, v in raw.items()}

    # -- stage timing -----------------------------------------------------------------------
    def mark_stage(self, job_id: str, stage: str, *, start: bool) -> None:
        """Record the first start and the latest end of a stage."""
        key, now = self._k(job_id, "times"), f"{time.time():.3f}"
        pipe = self._redis.pipeline(transaction=False)  # one round trip: tasks mark often
        if start:
            pipe.hsetnx(key, f"{stage}:start", now)
        else:
            pipe.hset(key, f"{stage}:end", now)
        self._expire(pipe, key)
        pipe.execute()

    def stage_seconds(self, job_id: str) -> dict[str, float]:
        """Wall time of each stage, from its first start to its last end."""
        raw = cast(dict[str, str], self._redis.hgetall(self._k(job_id, "times")))
        out: dict[str, float] = {}
        for key, value in raw.items():
            stage, _, edge = key.partition(":")
            if edge == "start" and f"{stage}:end" in raw:
                out[stage] = round(float(raw[f"{stage}:end"]) - float(value), 3)
        return out

    def created_at(self, job_id: str) -> float:
        """Submission time as a UNIX timestamp."""
        raw = self._redis.hget(self._k(job_id, "meta"), "created_at")
        return float(cast(str, raw)) if raw else time.time()

    def finished_at(self, job_id: str) -> float | None:
        """When the job finished (succeeded, failed or was cancelled), or None."""
        raw = self._redis.hget(self._k(job_id, "meta"), "finished_at")
        return float(cast(str, raw)) if raw else None

    # -- fan-out bookkeeping ----------------------------------------------------------------
    def complete(self, job_id: str, step: Step, item: str, *, total: int) -> bool:
        """Mark `item` of `step` done; True if the next stage should be started now.

        True for the call whose mark filled the set, and again for a redelivered call
        when the set is full but the next stage was never recorded as started (its first
        starter died): starting twice is harmless because every task is idempotent.
        """
        done = self._k(job_id, f"done:{step}")
        pipe = self._redis.pipeline(transaction=True)
        pipe.sadd(done, item)
        pipe.scard(done)
        pipe.hget(self._k(job_id, "meta"), f"next:{step}")
        self._expire(pipe, done)
        added, count, started = pipe.execute()[:3]
        if total <= 0 or count < total:  # no items: the job's state was lost (Redis emptied)
            return False
        return bool(added) or started is None

    def mark_next_started(self, job_id: str, step: Step) -> None:
        """Record that the stage after `step` was enqueued."""
        self._redis.hset(self._k(job_id, "meta"), f"next:{step}", "1")

    def is_done(self, job_id: str, step: Step, item: str) -> bool:
        """True if `item` of `step` has been completed already (a redelivered task)."""
        return bool(self._redis.sismember(self._k(job_id, f"done:{step}"), item))

    def done_count(self, job_id: str, step: Step) -> int:
        """How many items of `step` are complete."""
        return int(self._redis.scard(self._k(job_id, f"done:{step}")))

    # -- deliveries that died with their worker (Celery requeues those without a limit) -----
    def start_delivery(self, job_id: str, task: str, item: str) -> int:
        """Count a delivery of (task, item) as started; returns the unfinished ones so far.

        `end_delivery` clears the count when a delivery returns or raises, so what is left
        counts only deliveries whose worker died mid-task (SIGKILL, OOM, segfault).
        """
        key = self._k(job_id, "deliveries")
        pipe = self._redis.pipeline()
        pipe.hincrby(key, f"{task}:{item}", 1)
        self._expire(pipe, key)
        return int(pipe.execute()[0])

    def end_delivery(self, job_id: str, task: str, item: str) -> None:
        """The delivery of (task, item) finished in this process: clear its count."""
        self._redis.hdel(self._k(job_id, "deliveries"), f"{task}:{item}")

    # -- bundle and progress ----------------------------------------------------------------
    def save_bundle(self, job_id: str, bundle: Bundle) -> bool:
        """Store the bundle once; False if one was stored already."""
        key = self._k(job_id, "bundle")
        raw = bundle.model_dump_json()
        if not self._redis.set(key, raw, nx=True, ex=self.ttl_s):
            return False
        tenant = cast("str | None", self._redis.hget(self._k(job_id, "meta"), "tenant"))
        if tenant:  # a bundle is never refused: its job was admitted already
            self.stored.add(tenant, job_id, len(raw.encode()))
        return True

    def bundle(self, job_id: str) -> Bundle | None:
        """The job's bundle, once it has one."""
        raw = self._redis.get(self._k(job_id, "bundle"))
        return Bundle.model_validate_json(cast(str, raw)) if raw else None

    def progress(self, job_id: str) -> JobProgress:
        """A consistent-enough snapshot for display."""
        meta = cast(dict[str, str], self._redis.hgetall(self._k(job_id, "meta")))
        if "status" not in meta:  # unknown, or a stray write after Redis came back empty
            raise JobNotFound(job_id)
        return JobProgress(
            job_id=job_id,
            status=JobStatus(meta["status"]),
            error=meta.get("error"),
            reason=meta.get("reason"),
            queries=len(json.loads(meta["queries"])) if "queries" in meta else 0,
            searched=self.done_count(job_id, "search"),
            urls=int(self._redis.hlen(self._k(job_id, "urls"))),
            fetched=int(self._redis.hlen(self._k(job_id, "pages"))),
            failed=int(self._redis.hlen(self._k(job_id, "failures"))),
            embedded=self.done_count(job_id, "embed"),
            counters=self.counters(job_id),
        )
