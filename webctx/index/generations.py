"""Which pages a tenant's index search sees: generations, published in one Redis write.

Points are content-addressed and shared (by tenants and research jobs), so what makes a
page visible to one tenant's search is a pair of integer payload marks on its points:

    live_<tk>_from   the generation from which the page is live for the tenant
    live_<tk>_until  the generation from which it is not any more (absent while live)

(`tk` is a short hash of the tenant name: tenant names may hold dots, which payload paths
read as nesting; the fields are named in `webctx.stages.store`, with the rest of a point's
payload layout.) A search reads the tenant's published generation G (one GET) and asks
the store for `from <= G and not until <= G`: one indexed condition, however many pages.

A swap of URL u from hash A to B, under the tenant's commit lock (swaps that wait for the
lock meanwhile are committed together, as one generation: group commit):

1. B's points are stored first (by the re-index run), unmarked: no search sees them.
2. The plan (generation G+1, the record switch, the marks) is journaled in Redis.
3. B gets `from = G+1`, A (if no other URL of the tenant points at it) `until = G+1`.
   Searchers still at G see A, not B.
4. One MULTI switches u's record, publishes G+1 and clears the journal: from then on
   searchers see B, not A. Never both, never neither.

A commit that died between 2 and 4 is replayed from its journal by the next commit of the
tenant (every step is idempotent), so unpublished marks never surface later.

    webctx:index:<tenant>:gen      int  the published generation
    webctx:index:<tenant>:commit   str  the journal of the commit in flight (JSON)
    webctx:index:<tenant>:lock     str  the commit lock (SET NX PX, token)
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import cast

import redis
from pydantic import BaseModel, Field

from webctx.errors import ProviderError
from webctx.protocols import IndexWriter

LOCK_TTL_MS = 120_000
LOCK_WAIT_S = 60.0


def tenant_key(tenant: str) -> str:
    """The payload-key-safe id of a tenant."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:16]


class Change(BaseModel):
    """One URL's record move within a commit."""

    url: str
    record: str | None = None
    """The new PageRecord JSON; None removes the URL."""
    page: str | None = None
    """The new Page JSON (kept under its hash while referenced)."""
    new_sha: str | None = None
    old_sha: str | None = None


class Commit(BaseModel):
    """Record moves of one tenant and the marks they need (the journal's content)."""

    generation: int
    changes: list[Change] = Field(default_factory=list)
    live: dict[str, str] = Field(default_factory=dict)
    dead: list[str] = Field(default_factory=list)
    grace_s: float = 0.0


class Generations:
    """A tenant's published generation and the commit protocol that advances it."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._local = threading.Lock()
        self._tenant_locks: dict[str, threading.Lock] = {}

    def _key(self, tenant: str, name: str) -> str:
        return f"webctx:index:{tenant}:{name}"

    def key(self, tenant: str) -> str:
        """The key of the tenant's published generation (to read it inside a MULTI)."""
        return self._key(tenant, "gen")

    def published(self, tenant: str) -> int | None:
        """The tenant's published generation; None before its first commit."""
        raw = self._redis.get(self.key(tenant))
        return int(cast(str, raw)) if raw is not None else None

    @contextmanager
    def locked(self, tenant: str) -> Iterator[None]:
        """Hold the tenant's commit lock (commits of one tenant run one at a time).

        Threads of one process queue on a local lock first, so only one of them polls
        the Redis lock (which orders commits across processes)."""
        with self._local:
            local = self._tenant_locks.setdefault(tenant, threading.Lock())
        if not local.acquire(timeout=LOCK_WAIT_S):
            raise ProviderError("redis", f"index commit lock of {tenant!r} not free")
        try:
            key, token = self._key(tenant, "lock"), uuid.uuid4().hex
            deadline, pause = time.monotonic() + LOCK_WAIT_S, 0.001
            while not self._redis.set(key, token, nx=True, px=LOCK_TTL_MS):
                if time.monotonic() > deadline:
                    raise ProviderError("redis", f"index commit lock of {tenant!r} not free")
                time.sleep(pause)
                pause = min(pause * 2, 0.01)
            try:
                yield
            finally:
                # Release only our own lock (it may have expired and been taken meanwhile).
                self._redis.eval(_RELEASE, 1, key, token)
        finally:
            local.release()

    def journal_key(self, tenant: str) -> str:
        """The key of the tenant's journal (to read it in a pipeline)."""
        return self._key(tenant, "commit")

    def journal(self, tenant: str, commit: Commit) -> None:
        """Record the commit about to be applied (replayed if this process dies)."""
        self._redis.set(self._key(tenant, "commit"), commit.model_dump_json())

    def pending(self, tenant: str) -> Commit | None:
        """The journaled commit a dead committer left, if any."""
        raw = self._redis.get(self._key(tenant, "commit"))
        return Commit.model_validate_json(cast(str, raw)) if raw else None

    def publish(self, pipe: redis.client.Pipeline, tenant: str, generation: int) -> None:
        """Queue, in the caller's MULTI, the publication of `generation` and the journal's end."""
        pipe.set(self._key(tenant, "gen"), generation)
        pipe.delete(self._key(tenant, "commit"))


def mark(store: IndexWriter, tenant: str, commit: Commit) -> None:
    """Apply a commit's marks to the store (before its generation is published)."""
    if commit.live or commit.dead:
        store.mark_pages(tenant_key=tenant_key(tenant), generation=commit.generation,
                         live=commit.live, dead=commit.dead)  # fmt: skip


def site_of(page_site: str) -> str:
    """The site value a page's points carry (what a site filter matches)."""
    return page_site.strip().lower()


def live_map(hashes: Mapping[str, str]) -> dict[str, str]:
    """hash -> site, sites normalised."""
    return {sha: site_of(site) for sha, site in hashes.items()}


_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
