"""Shared work across jobs: a URL cache of fetched pages and a search-results cache.

    webctx:urlcache:<sha256(normalised url)>   hash  sha, fetched_at, etag, last_modified
    webctx:searchcache:<sha256(provider, limit, query)>   JSON list of SearchResult

A page fetched within `ttl_s` is reused by any job (any tenant: the page is public web
content, and the job store keeps it by content hash already), so a batch downloads each
page once per freshness window; the stored page is linked to the new job as if fetched,
which also puts it in the tenant's own page index. Entries expire with their window.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis

from webctx.models import Page, SearchResult
from webctx.stages.search import normalize_url

_PREFIX = "webctx"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


class PageCache:
    """Normalised URL -> content hash of the page last fetched from it, fresh for `ttl_s`."""

    def __init__(self, client: redis.Redis, *, ttl_s: int) -> None:
        self.r = client
        self.ttl_s = ttl_s

    def _key(self, url: str) -> str:
        return f"{_PREFIX}:urlcache:{_digest(normalize_url(url))}"

    def fresh_sha(self, url: str, *, now: float | None = None) -> str | None:
        """The content hash of a page fetched from `url` within the window, or None."""
        if self.ttl_s <= 0:
            return None
        raw = cast(dict[str, str], self.r.hgetall(self._key(url)))
        if not raw or "sha" not in raw:
            return None
        age = (now if now is not None else time.time()) - float(raw.get("fetched_at", "0"))
        return raw["sha"] if age < self.ttl_s else None

    def fresh_page(self, url: str, load: Callable[[str], Page | None]) -> Page | None:
        """The page fetched from `url` within the window (loaded by hash), or None."""
        sha = self.fresh_sha(url)
        return load(sha) if sha else None

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
        pipe = self.r.pipeline()
        for key in {self._key(url), self._key(page.final_url)}:
            pipe.hset(key, mapping=fields)
            pipe.expire(key, self.ttl_s)
        pipe.execute()


class SearchCache:
    """(provider, limit, query) -> results, for `ttl_s`: a query is sent once per window."""

    def __init__(self, client: redis.Redis, *, ttl_s: int, provider: str) -> None:
        self.r = client
        self.ttl_s = ttl_s
        self.provider = provider

    def _key(self, query: str, limit: int) -> str:
        normal = " ".join(query.split()).casefold()
        return f"{_PREFIX}:searchcache:{_digest(self.provider, str(limit), normal)}"

    def get(self, query: str, *, limit: int) -> list[SearchResult] | None:
        """The cached results of the query, or None."""
        if self.ttl_s <= 0:
            return None
        raw = self.r.get(self._key(query, limit))
        if raw is None:
            return None
        return [SearchResult.model_validate(item) for item in json.loads(cast(str, raw))]

    def put(self, query: str, results: Sequence[SearchResult], *, limit: int) -> None:
        """Remember a query's results (an empty answer is not cached: it may be an outage)."""
        if self.ttl_s <= 0 or not results:
            return
        payload = json.dumps([r.model_dump() for r in results])
        self.r.set(self._key(query, limit), payload, ex=self.ttl_s)
