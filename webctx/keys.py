"""Every family of keys webctx writes in Redis: its pattern, the one module that owns it
(spells its names, sets its TTLs, holds its Lua scripts; everything else calls that
module's methods), how it expires, and whose it is.

`expiry`: "ttl", every key expires (by design, not only eventually); "none", kept until
its owner deletes it (the reason is in the family's note); "external", set by another
program (Celery and kombu in a Redis broker: `webctx.workers.celeryconfig`'s
REDIS_BROKER_KEYS).

`scope`: "tenant", the key names its tenant (`{tenant}`), so `tenant_bytes` counts it;
"owned", the key names a job, batch, API key or run whose own record names the tenant;
"shared", content-addressed or process-wide data that no single tenant owns.

tests/unit/test_keys.py checks that no other module spells a `webctx:` key, and
tests/integration/test_keys.py that every key a job, a batch and a source refresh leave in
a real Redis belongs to a family here and expires as it says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import redis

Expiry = Literal["ttl", "none", "external"]
Scope = Literal["tenant", "owned", "shared"]


@dataclass(frozen=True)
class KeyFamily:
    """Keys of one shape: `pattern` names each variable part in braces."""

    pattern: str
    owner: str
    expiry: Expiry
    scope: Scope
    note: str

    @cached_property
    def regex(self) -> re.Pattern[str]:
        """Matches the family's keys: a variable part holds no colon, except the last one."""
        parts = re.split(r"(\{\w+\})", self.pattern)
        holes = [i for i, part in enumerate(parts) if part.startswith("{")]
        last = holes[-1] if holes else -1
        out = [
            ("(.+)" if i == last else "([^:]+)") if i in holes else re.escape(part)
            for i, part in enumerate(parts)
        ]
        return re.compile("".join(out) + r"\Z")

    def glob(self, **values: str) -> str:
        """A SCAN MATCH pattern: the given parts filled in, the others `*`."""
        return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "*"), self.pattern)


_JOBS, _BATCHES, _TENANTS = "webctx.jobs.store", "webctx.jobs.batches", "webctx.jobs.tenants"
_CACHES, _RECORDS = "webctx.jobs.caches", "webctx.index.page_records"

OWNER_PARTS: dict[str, str] = {"webctx.jobs.round_store": "webctx.jobs.store"}
"""Modules that keep part of an owner's family in a file of their own (the owner reached its
size cap): the owner builds them with its own client and key function."""

INDEX_GLOBS = ("webctx:index:*", "webctx:sources:*")
"""SCAN patterns of the index's key families and the source registry (what `webctx index
export` carries; the run locks and due claims are in these families' owners, not moved)."""

FAMILIES: tuple[KeyFamily, ...] = (
    # -- the job engine -------------------------------------------------------------------
    KeyFamily("webctx:job:{job_id}:{part}", _JOBS, "ttl", "owned",
              "a job's state: meta (the tenant), search, urls, pages, failures, counters, "
              "retrieved (how each page was got), times, done:<step>, deliveries, bundle; "
              "WEBCTX_JOB_TTL_S after each write"),
    KeyFamily("webctx:page:{content_sha256}", _JOBS, "ttl", "shared",
              "a page a job fetched, by content hash; any job that meets the text links it"),
    KeyFamily("webctx:tenant:{tenant}:pages", "webctx.jobs.tenant_pages", "ttl", "tenant",
              "the tenant's pages by hash and URL (get_source and the MCP resources see "
              "only these)"),
    KeyFamily("webctx:tenant:{tenant}:stored", "webctx.jobs.quota", "ttl", "tenant",
              "the tenant's jobs that hold bytes, by when they expire (the quota's index; "
              "job ids by prefix)"),
    KeyFamily("webctx:tenant:{tenant}:stored-bytes", "webctx.jobs.quota", "ttl", "tenant",
              "bytes each of those jobs holds (request and bundle), and their sum"),
    KeyFamily("webctx:tenant:{tenant}:front", "webctx.jobs.admission", "ttl", "tenant",
              "the tenant's unfinished jobs at the front of the queues, by when their "
              "slots lapse (WEBCTX_ADMISSION__RUNNING)"),
    KeyFamily("webctx:tenant:{tenant}:behind", "webctx.jobs.admission", "ttl", "tenant",
              "the tenant's unfinished jobs admitted past the front ones, not yet held "
              "(or queued behind them with WEBCTX_ADMISSION__HOLD=false), by when their "
              "slots lapse (WEBCTX_ADMISSION__QUEUED)"),
    KeyFamily("webctx:tenant:{tenant}:held", "webctx.jobs.admission", "ttl", "tenant",
              "the tenant's recorded jobs waiting for a front slot, none of their tasks "
              "sent, by when their slots lapse (oldest first)"),
    KeyFamily("webctx:admission:held", "webctx.jobs.admission", "ttl", "shared",
              "the tenants with held jobs (the admission reconciler's list)"),
    KeyFamily("webctx:admission:front", "webctx.jobs.admission", "ttl", "shared",
              "every tenant's front jobs as <tenant>/<job>, by when their slots lapse (the "
              "batch feeder yields to them)"),
    KeyFamily("webctx:tenant:{tenant}:batches", _BATCHES, "ttl", "tenant",
              "the tenant's batch ids by when their records expire (ids by prefix)"),
    KeyFamily("webctx:idem:{tenant}:{digest}", _JOBS, "ttl", "tenant",
              "the job an Idempotency-Key named"),
    KeyFamily("webctx:task:{digest}", "webctx.jobs.task_records", "ttl", "owned",
              "an MCP task handle by its id's hash: the job or batch it follows, the "
              "tenant; WEBCTX_JOB_TTL_S after its creation"),
    KeyFamily("webctx:batches:running", _BATCHES, "none", "shared",
              "ids of batches still feeding; a batch leaves it when it ends"),
    KeyFamily("webctx:batchname:{tenant}:{digest}", _BATCHES, "ttl", "tenant",
              "the batch a name stands for (resubmission)"),
    KeyFamily("webctx:batch:{batch_id}", _BATCHES, "ttl", "owned",
              "a batch's meta (the tenant) and its :items, :inflight, :outcome, :requeue, "
              ":stats, :lock and :tick"),
    KeyFamily("webctx:apikey:{digest}", _TENANTS, "none", "owned",
              "an API key's record (the tenant), by the key's hash; deleted when revoked"),
    KeyFamily("webctx:apikey-id:{key_id}", _TENANTS, "none", "owned",
              "a key id's hash, so a key can be revoked by id; deleted with it"),
    KeyFamily("webctx:ratelimit:{key_id}:{window}", _TENANTS, "ttl", "owned",
              "an API key's requests in one window"),
    KeyFamily("webctx:staged:{store_scope}:{content_sha256}", "webctx.jobs.staging", "ttl",
              "shared", "a page's chunk spans and vectors between its embed and store tasks"),
    KeyFamily("webctx:urlcache:{url_digest}", _CACHES, "ttl", "shared",
              "the page last downloaded from a URL, and its validators"),
    KeyFamily("webctx:urlfail:{url_digest}", _CACHES, "ttl", "shared",
              "why the last download of a URL failed"),
    KeyFamily("webctx:urlflight:{url_digest}", _CACHES, "ttl", "shared",
              "the claim of the one job downloading a URL"),
    KeyFamily("webctx:searchcache:{query_digest}", _CACHES, "ttl", "shared",
              "a search query's results"),
    KeyFamily("webctx:indexed:{content_sha256}", _CACHES, "ttl", "shared",
              "stored-page marks: chunks of the page in the vector store, per store scope"),
    KeyFamily("webctx:indexed-epoch:{store_scope}", _CACHES, "none", "shared",
              "the epoch of a store scope's marks: it must outlive the marks it voids"),
    KeyFamily("webctx:emb:{text_digest}", "webctx.jobs.embed_cache", "ttl", "shared",
              "a text's vector under one model (refreshed on each hit)"),
    # -- the persistent index (before its tenant-named families: a tenant may be "refs") ----
    KeyFamily("webctx:index:refs:{content_sha256}", _RECORDS, "none", "shared",
              "the '<tenant> <url>' records pointing at a page; emptied by their moves"),
    KeyFamily("webctx:index:page:{content_sha256}", _RECORDS, "none", "shared",
              "an indexed page while some record points at it; the sweep deletes it"),
    KeyFamily("webctx:index:graveyard", _RECORDS, "none", "shared",
              "pages no record points at, and when the sweep may delete their points"),
    KeyFamily("webctx:index:run:{run_id}", "webctx.index.runs", "ttl", "owned",
              "a re-index run started by hand: pending count, the tenant, reports"),
    KeyFamily("webctx:index:lock:{tenant}:{source_id}", "webctx.index.runs", "ttl", "tenant",
              "the run holding a source (scheduled or by hand)"),
    KeyFamily("webctx:index:{tenant}:pages", _RECORDS, "none", "tenant",
              "the tenant's page records: each indexed URL's current page; the index itself"),
    KeyFamily("webctx:index:{tenant}:gen", "webctx.index.generations", "none", "tenant",
              "the generation a search of the tenant sees"),
    KeyFamily("webctx:index:{tenant}:commit", "webctx.index.generations", "none", "tenant",
              "the journal of a commit in flight; deleted when it is published"),
    KeyFamily("webctx:index:{tenant}:lock", "webctx.index.generations", "ttl", "tenant",
              "the tenant's commit lock"),
    KeyFamily("webctx:sources:due", "webctx.index.sources", "none", "shared",
              "every scheduled source ('<tenant>/<source_id>') and when it is due"),
    KeyFamily("webctx:sources:claim:{tenant}/{source_id}:{due}", "webctx.index.sources",
              "ttl", "tenant", "the one tick that won a due run"),
    KeyFamily("webctx:sources:{tenant}", "webctx.index.sources", "none", "tenant",
              "the tenant's registered sources"),
    # -- the workers (in the broker's Redis) ----------------------------------------------
    KeyFamily("webctx:workers", "webctx.workers.liveness", "none", "shared",
              "each worker process's last beat; it leaves when it stops holding nothing, "
              "or when a live worker requeues its tasks"),
    KeyFamily("webctx:worker:{worker_id}:held", "webctx.workers.liveness", "ttl", "shared",
              "delivery tags a worker process holds unacked (renewed by each beat)"),
    # -- the local service's Valkey ------------------------------------------------------
    KeyFamily("webctx:inbox", "webctx.api.inbox", "ttl", "shared",
              "research requests handed to the local service by `webctx research`; each "
              "push renews its TTL, the service pops them"),
    KeyFamily("webctx:inbox:reply:{request_id}", "webctx.api.inbox", "ttl", "shared",
              "the service's answer to one handed request: its job id or its error"),
    # -- the network guard ----------------------------------------------------------------
    KeyFamily("webctx:pace:{host}", "webctx.net.politeness", "ttl", "shared",
              "a host's pace and 429/503 pause, shared by every fetch worker"),
    KeyFamily("webctx:rl:{namespace}:{part}", "webctx.net.ratelimit", "ttl", "shared",
              "an embeddings key's request log, requests in flight, token sum, pause and "
              "learned limits"),
    KeyFamily("webctx:breaker:{provider}:{endpoint}", "webctx.net.breaker", "ttl", "shared",
              "a provider endpoint's failure streak or outage (the shared breaker); its "
              "first answer deletes it"),
)  # fmt: skip


def family_of(key: str, families: tuple[KeyFamily, ...] = FAMILIES) -> KeyFamily | None:
    """The first family whose pattern `key` matches, or None."""
    return next((f for f in families if f.regex.match(key)), None)


def tenant_bytes(client: redis.Redis, tenant: str) -> int:
    """Bytes Redis holds in the keys that name `tenant` (MEMORY USAGE of each, summed).

    Counts the tenant-scoped families only: a job's or batch's state names its tenant in
    its record, not in its keys, and shared pages belong to every tenant that met them."""
    total = 0
    for family in FAMILIES:
        if family.scope != "tenant":
            continue
        match = family.glob(tenant=tenant)
        for key in client.scan_iter(match=match, count=500):
            name = key.decode() if isinstance(key, bytes) else str(key)
            if family_of(name) is family:  # not another family's key of the same shape
                total += int(client.memory_usage(key) or 0)
    return total
