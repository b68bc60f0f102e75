"""Each tenant's own index of the pages its jobs fetched: by content hash and by URL.

`get_source` and the MCP source resources read pages only through it, so a tenant never
sees a page that only another tenant's jobs fetched (the pages themselves are shared,
content-addressed, in `webctx.jobs.store`).

    webctx:tenant:<tenant>:pages   hash  content_sha256 | url | final_url -> content_sha256
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast

import redis

from webctx.models import Page

_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")


@dataclass(frozen=True)
class TenantSource:
    """One page a tenant's jobs fetched, and a URL it was fetched at."""

    content_sha256: str
    url: str


def _key(tenant: str) -> str:
    return f"webctx:tenant:{tenant}:pages"


class TenantPages:
    """The tenant page index; every write renews the tenant's key to `ttl_s`."""

    def __init__(self, client: redis.Redis, *, ttl_s: int) -> None:
        self._redis = client
        self.ttl_s = ttl_s

    def link(self, pipe: Any, tenant: str, page: Page) -> None:
        """Add `page` to the tenant's index, in the caller's pipeline."""
        refs = {page.content_sha256, page.url, page.final_url}
        pipe.hset(_key(tenant), mapping=dict.fromkeys(refs, page.content_sha256))
        pipe.expire(_key(tenant), self.ttl_s)

    def sha_of(self, tenant: str, ref: str) -> str | None:
        """The content hash a URL or hash of the tenant's pages names, else None."""
        return cast("str | None", self._redis.hget(_key(tenant), ref))

    def scan(
        self, tenant: str, *, cursor: int = 0, count: int = 100
    ) -> tuple[int, list[TenantSource]]:
        """About `count` of the tenant's sources from `cursor` (HSCAN), and the next cursor
        (0: the end). Over a full scan each URL a page was fetched at appears once; a page
        fetched at two URLs (a redirect) may appear under both."""
        found: dict[str, TenantSource] = {}
        position = cursor
        while True:
            position, fields = self._redis.hscan(_key(tenant), position, count=count)
            for ref, sha in cast(dict[str, str], fields).items():
                if ref != sha and _SHA256.match(sha) and sha not in found:
                    found[sha] = TenantSource(sha, ref)
            if position == 0 or len(found) >= count:
                return int(position), list(found.values())
