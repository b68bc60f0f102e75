"""Shared work across jobs: a URL cache of fetched pages, a search-results cache, and the
marks of pages known to be stored in the vector store.

    webctx:urlcache:<sha256(normalised url)>   hash  sha, fetched_at, etag, last_modified
    webctx:urlfail:<sha256(normalised url)>    hash  stage, reason, error, failed_at (a failed
                                               download)
    webctx:urlflight:<sha256(normalised url)>  one downloader's claim (SET NX, expiring)
    webctx:searchcache:<sha256(provider, limit, query)>   JSON list of SearchResult
    webctx:indexed:<content sha>   hash  <sha256(store, model, chunking)[:16]>: chunks stored
                                         (the stored-page marks)

A page fetched within `ttl_s` (or a job's shorter `max_age`, webctx/jobs/freshness.py) is
reused by any job (any tenant: the page is public web
content, and the job store keeps it by content hash already), so a batch downloads each
page once per freshness window; the stored page is linked to the new job as if fetched,
which also puts it in the tenant's own page index. Past the window, an entry with an ETag
or Last-Modified makes the next download conditional: a 304 reuses the stored page.
Downloads are single-flight: of the jobs that want one URL at once, one downloads it and the
others wait for its entry (or its failure, remembered for a shorter window). A page whose
chunks are already in the vector store is not chunked, embedded or upserted again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from webctx.models import Page, SearchResult
from webctx.stages.search import normalize_url

FAILURE_TTL_S = 600
"""A failed download is remembered this long at most (a dead URL is retried after it)."""
REVALIDATE_WINDOWS = 7
"""A page's entry outlives its freshness window this many times over: past the window, its
ETag / Last-Modified make the next download a conditional GET (304: the page is reused)."""


@dataclass(frozen=True)
class StaleEntry:
    """A page fetched before the window, and the validators to ask whether it changed."""

    sha: str
    etag: str | None
    last_modified: str | None


@dataclass(frozen=True)
class CacheEntry:
    """The page last fetched from a URL (any age), and when it was confirmed current."""

    sha: str
    fetched_at: float
    etag: str | None
    last_modified: str | None

    @property
    def revalidatable(self) -> bool:
        """True if a conditional GET can ask whether the page changed."""
        return bool(self.etag or self.last_modified)


@dataclass(frozen=True)
class RememberedFailure:
    """Why the last download of a URL failed (and when: epoch seconds, 0 if unknown)."""

    stage: str
    reason: str
    error: str
    failed_at: float = field(default=0.0, compare=False)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


class PageCache:
    """Normalised URL -> content hash of the page last fetched from it, fresh for `ttl_s`."""

    def __init__(self, client: redis.Redis, *, ttl_s: int) -> None:
        self._redis = client
        self.ttl_s = ttl_s

    def _key(self, url: str) -> str:
        return f"webctx:urlcache:{_digest(normalize_url(url))}"

    def fresh_sha(self, url: str, *, now: float | None = None) -> str | None:
        """The content hash of a page fetched from `url` within the window, or None."""
        if self.ttl_s <= 0:
            return None
        raw = cast(dict[str, str], self._redis.hgetall(self._key(url)))
        if not raw or "sha" not in raw:
            return None
        age = (now if now is not None else time.time()) - float(raw.get("fetched_at", "0"))
        return raw["sha"] if age < self.ttl_s else None

    def entry(self, url: str) -> CacheEntry | None:
        """The page last fetched from `url`, of any age its key still holds, or None."""
        if self.ttl_s <= 0:
            return None
        raw = cast(dict[str, str], self._redis.hgetall(self._key(url)))
        if "sha" not in raw:
            return None
        return CacheEntry(raw["sha"], float(raw.get("fetched_at") or 0),
                          raw.get("etag") or None, raw.get("last_modified") or None)  # fmt: skip

    def fresh_page(self, url: str, load: Callable[[str], Page | None]) -> Page | None:
        """The page fetched from `url` within the window (loaded by hash), or None."""
        sha = self.fresh_sha(url)
        return load(sha) if sha else None

    def stale(self, url: str) -> StaleEntry | None:
        """The last page of `url` (past its window) if it came with a validator, or None."""
        if self.ttl_s <= 0:
            return None
        raw = cast(dict[str, str], self._redis.hgetall(self._key(url)))
        if "sha" not in raw or not (raw.get("etag") or raw.get("last_modified")):
            return None
        return StaleEntry(raw["sha"], raw.get("etag") or None, raw.get("last_modified") or None)

    def failure(self, url: str) -> RememberedFailure | None:
        """Why the download of `url` failed within the failure window, or None."""
        if self.ttl_s <= 0:
            return None
        raw = cast(dict[str, str], self._redis.hgetall(self._failure_key(url)))
        if not raw:
            return None
        failed_at = float(raw.get("failed_at") or 0)
        return RememberedFailure(raw["stage"], raw["reason"], raw["error"], failed_at)

    def remember_failure(self, url: str, failure: RememberedFailure) -> None:
        """Record a failed download, for at most FAILURE_TTL_S; a fresh page stays."""
        if self.ttl_s <= 0 or self.fresh_sha(url):
            return
        key = self._failure_key(url)
        failed_at = failure.failed_at or time.time()
        fields: dict[Any, Any] = {"stage": failure.stage, "reason": failure.reason,
                                  "error": failure.error[:500],
                                  "failed_at": f"{failed_at:.3f}"}  # fmt: skip
        pipe = self._redis.pipeline()
        pipe.hset(key, mapping=fields)
        pipe.expire(key, min(self.ttl_s, FAILURE_TTL_S))
        pipe.execute()

    def claim_download(self, url: str, *, hold_s: float) -> bool:
        """True if this caller is to download `url` (no one else is, for `hold_s` at most)."""
        key = self._flight_key(url)
        return bool(self._redis.set(key, "1", nx=True, px=max(1, int(hold_s * 1000))))

    def release_download(self, url: str) -> None:
        """End this caller's claim (after `remember` or `remember_failure`)."""
        self._redis.delete(self._flight_key(url))

    def release_all_downloads(self) -> int:
        """End every claim (their holders are known to be dead: a local service starting,
        the only process that downloads for its data directory); how many there were. A
        task handed back or killed mid-download leaves its claim, and its next delivery
        would otherwise wait it out as another job's."""
        keys = list(self._redis.scan_iter(match="webctx:urlflight:*", count=1000))
        return int(self._redis.delete(*keys)) if keys else 0

    def wait_download(self, url: str, *, timeout_s: float, poll_s: float = 0.1) -> bool:
        """Wait until no one is downloading `url`; False if the claim outlived `timeout_s`."""
        key = self._flight_key(url)
        deadline = time.monotonic() + timeout_s
        while self._redis.exists(key):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def _flight_key(self, url: str) -> str:
        return f"webctx:urlflight:{_digest(normalize_url(url))}"

    def _failure_key(self, url: str) -> str:
        return f"webctx:urlfail:{_digest(normalize_url(url))}"

    def remember(self, url: str, page: Page) -> None:
        """Record that `page` was just downloaded from `url` (and from its final URL)."""
        if self.ttl_s <= 0:
            return
        fields: dict[Any, Any] = {
            "sha": page.content_sha256,
            "fetched_at": f"{page.fetched_at.timestamp():.3f}",
            "etag": page.etag or "",
            "last_modified": page.last_modified or "",
        }
        pipe = self._redis.pipeline()
        for link in {url, page.final_url}:
            key = self._key(link)
            pipe.delete(key, self._failure_key(link))  # a remembered failure goes too
            pipe.hset(key, mapping=fields)
            pipe.expire(key, self.ttl_s * REVALIDATE_WINDOWS)
        pipe.execute()


class SearchCache:
    """(provider, limit, query) -> results, for `ttl_s`: a query is sent once per window."""

    def __init__(self, client: redis.Redis, *, ttl_s: int, provider: str) -> None:
        self._redis = client
        self.ttl_s = ttl_s
        self.provider = provider

    def _key(self, query: str, limit: int) -> str:
        normal = " ".join(query.split()).casefold()
        return f"webctx:searchcache:{_digest(self.provider, str(limit), normal)}"

    def get(self, query: str, *, limit: int) -> list[SearchResult] | None:
        """The cached results of the query, or None."""
        if self.ttl_s <= 0:
            return None
        raw = self._redis.get(self._key(query, limit))
        if raw is None:
            return None
        return [SearchResult.model_validate(item) for item in json.loads(cast(str, raw))]

    def put(self, query: str, results: Sequence[SearchResult], *, limit: int) -> None:
        """Remember a query's results (an empty answer is not cached: it may be an outage)."""
        if self.ttl_s <= 0 or not results:
            return
        payload = json.dumps([r.model_dump() for r in results])
        self._redis.set(self._key(query, limit), payload, ex=self.ttl_s)


class StoredPages:
    """Stored-page marks: content hash -> chunks stored, per store scope (store, embedding
    model, chunking). A page already in the vector store is not chunked, embedded or
    upserted again while its mark lives. (The keys keep the name they had as "indexed"
    marks: renaming them would drop every mark, and each page would be stored again.)

    `forget` must follow any deletion of a page's points (the index's page removal does);
    `forget_store` any loss of the store itself (a process that opens it empty calls it:
    the store was wiped, or is new at an address a wiped one had). It moves the scope to
    a new epoch, and marks of an older epoch count as unknown."""

    def __init__(self, client: redis.Redis, *, ttl_s: int, scope: Sequence[str]) -> None:
        self._redis = client
        self.ttl_s = ttl_s
        self.scope = _digest(*scope)[:16]
        self._epoch_key = f"webctx:indexed-epoch:{self.scope}"

    @staticmethod
    def _key(content_sha256: str) -> str:
        return f"webctx:indexed:{content_sha256}"

    def chunks(self, content_sha256: str) -> int | None:
        """How many chunks of the page are stored, or None if it is not known to be."""
        if self.ttl_s <= 0:
            return None
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self._epoch_key)
        pipe.hget(self._key(content_sha256), self.scope)
        epoch, raw = pipe.execute()
        if raw is None:
            return None
        chunks, _, marked_in = cast(str, raw).partition("@")
        return int(chunks) if (marked_in or "0") == (epoch or "0") else None

    def mark(self, content_sha256: str, chunks: int) -> None:
        """Record that all `chunks` chunks of the page are stored (in the current epoch)."""
        if self.ttl_s > 0:
            epoch = cast(str | None, self._redis.get(self._epoch_key)) or "0"
            key = self._key(content_sha256)
            pipe = self._redis.pipeline()
            pipe.hset(key, self.scope, f"{chunks}@{epoch}")
            pipe.expire(key, self.ttl_s)
            pipe.execute()

    def forget_store(self) -> None:
        """Forget every page marked in this scope: its store no longer holds them."""
        self._redis.incr(self._epoch_key)  # no TTL: it must outlive the marks it voids

    def forget(self, content_sha256s: Sequence[str]) -> None:
        """Drop what is known of pages whose points were deleted (in every scope)."""
        if content_sha256s:
            self._redis.delete(*(self._key(sha) for sha in content_sha256s))
