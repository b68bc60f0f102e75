"""The registry of indexed sources per tenant, and their schedule, in Redis.

A source is a single page, a sitemap (index sitemaps too) or an RSS/Atom feed, with a
refresh interval. The schedule is a sorted set of next-due times, so it survives restarts
of every process, and `claim_due` hands each due run to exactly one caller: two Celery
beat processes started by mistake both send ticks, both ticks read the same due time, and
only the one whose `SET NX` on (source, due time) succeeds runs it. The claim sits where
the work starts, not in the beat, so redelivered or duplicated ticks are covered too.

    webctx:sources:<tenant>          hash   source_id -> Source JSON
    webctx:sources:due               zset   "<tenant>/<source_id>" -> next due (UNIX s)
    webctx:sources:claim:<member>:<due>  str  the run of that due time (SET NX, expires)
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from urllib.parse import urljoin, urlsplit

import redis
from lxml import etree
from pydantic import BaseModel, Field

from webctx.errors import BlockedURL, InvalidRequest
from webctx.jobs.tenants import check_tenant
from webctx.protocols import ConditionalFetcher

_DUE = "webctx:sources:due"
SourceKind = Literal["auto", "page", "sitemap", "feed"]
_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.I)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MIN_INTERVAL_S = 1
MAX_INTERVAL_S = 365 * 86400
MIN_EVERY_S = 300
"""The shortest refresh interval a source may be registered with: five minutes, ten ticks
of the schedule. A re-index run asks every page of a sitemap or feed again; more often
than this it would load the publisher (and this machine) for pages that seldom change
faster. `sources refresh` re-indexes at once when a page must be fresh now."""


class Source(BaseModel):
    """One registered source of a tenant."""

    source_id: str
    tenant: str
    url: str
    kind: SourceKind = "auto"
    every_s: int = Field(ge=MIN_INTERVAL_S, le=MAX_INTERVAL_S)
    created_at: float
    runs: int = 0
    last_run_at: float | None = None
    last_started_at: float | None = None
    """When the last finished run started: the schedule's next due time counts from it."""
    last_report: dict[str, float] = Field(default_factory=dict)


def parse_interval(text: str) -> int:
    """Seconds in an interval like `90`, `15m`, `6h`, `1d`; InvalidRequest otherwise."""
    match = _INTERVAL.match(text)
    if not match:
        raise InvalidRequest(f"invalid interval {text!r}: use e.g. 30m, 6h, 1d")
    seconds = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:
        raise InvalidRequest(f"interval {text!r} out of range (1 s to 365 d)")
    return seconds


def _spelled(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def source_id_for(tenant: str, url: str) -> str:
    """A stable id of a tenant's source URL."""
    return hashlib.sha256(f"{tenant}\n{url}".encode()).hexdigest()[:16]


def _check_url(url: str) -> str:
    if not re.match(r"^https?://[^\s/]+", url) or len(url) > 4000:
        raise InvalidRequest(f"invalid source URL {url[:200]!r}: an http(s) URL is needed")
    return url


class SourceRegistry:
    """Add, list and remove sources; claim due runs for exactly one runner. No source is
    registered to run more often than every `min_every_s` (tests of the schedule lower it)."""

    def __init__(self, client: redis.Redis, *, min_every_s: int = MIN_EVERY_S) -> None:
        self._redis = client
        self.min_every_s = min_every_s

    def _key(self, tenant: str) -> str:
        return f"webctx:sources:{tenant}"

    @staticmethod
    def _member(tenant: str, source_id: str) -> str:
        return f"{tenant}/{source_id}"

    def add(self, tenant: str, url: str, *, every_s: int, kind: SourceKind = "auto") -> Source:
        """Register (or update) a source; it is due at once. InvalidRequest for an interval
        below `min_every_s`."""
        check_tenant(tenant)
        if every_s < self.min_every_s:
            raise InvalidRequest(
                f"refresh interval {every_s} s is below the minimum of {self.min_every_s} s "
                f"(every {_spelled(self.min_every_s)}; `sources refresh` re-indexes now)"
            )
        _check_url(url)
        source_id = source_id_for(tenant, url)
        previous = self.get(tenant, source_id)
        source = Source(
            source_id=source_id,
            tenant=tenant,
            url=url,
            kind=kind,
            every_s=every_s,
            created_at=previous.created_at if previous else time.time(),
            runs=previous.runs if previous else 0,
            last_run_at=previous.last_run_at if previous else None,
            last_started_at=previous.last_started_at if previous else None,
            last_report=previous.last_report if previous else {},
        )
        pipe = self._redis.pipeline()
        pipe.hset(self._key(tenant), source_id, source.model_dump_json())
        pipe.zadd(_DUE, {self._member(tenant, source_id): time.time()})
        pipe.execute()
        return source

    def get(self, tenant: str, source_id: str) -> Source | None:
        """One source by id."""
        raw = self._redis.hget(self._key(tenant), source_id)
        return Source.model_validate_json(cast(str, raw)) if raw else None

    def find(self, tenant: str, ref: str) -> Source | None:
        """A source by id or by URL."""
        return self.get(tenant, ref) or self.get(tenant, source_id_for(tenant, ref))

    def list_for(self, tenant: str) -> list[Source]:
        """The tenant's sources, oldest first."""
        raw = cast(dict[str, str], self._redis.hgetall(self._key(tenant)))
        sources = [Source.model_validate_json(v) for v in raw.values()]
        return sorted(sources, key=lambda s: (s.created_at, s.url))

    def remove(self, tenant: str, ref: str) -> Source | None:
        """Unregister a source (by id or URL); its pages are removed by the index."""
        source = self.find(tenant, ref)
        if source is None:
            return None
        pipe = self._redis.pipeline()
        pipe.hdel(self._key(tenant), source.source_id)
        pipe.zrem(_DUE, self._member(tenant, source.source_id))
        pipe.execute()
        return source

    def due_at(self, tenant: str, source_id: str) -> float | None:
        """The source's next due time (UNIX s), None when it is not scheduled."""
        score = self._redis.zscore(_DUE, self._member(tenant, source_id))
        return None if score is None else float(score)

    def claim_due(self, *, now: float | None = None, limit: int = 100) -> list[Source]:
        """Sources due at `now` that this caller won; each due time is won exactly once."""
        now = time.time() if now is None else now
        due = cast(
            list[tuple[str, float]],
            self._redis.zrangebyscore(
                _DUE, "-inf", now, start=0, num=limit, withscores=True
            ),  # fmt: skip
        )
        won: list[Source] = []
        for member, due_at in due:
            tenant, _, source_id = member.partition("/")
            source = self.get(tenant, source_id)
            if source is None:
                self._redis.zrem(_DUE, member)
                continue
            claim = f"webctx:sources:claim:{member}:{due_at:.6f}"
            if not self._redis.set(claim, f"{now:.3f}", nx=True, ex=source.every_s + 3600):
                continue  # another tick (a second beat, a redelivery) runs this one
            # XX: a source removed meanwhile is not scheduled again.
            self._redis.zadd(_DUE, {member: now + source.every_s}, xx=True)
            won.append(source)
        return won

    def record_run(
        self, source: Source, report: dict[str, Any], *, started_at: float | None = None
    ) -> None:
        """Keep the last run's time and counts on the source (if it still exists), and move
        its next due time to `every_s` after the run started, unless already later: a
        run by hand (`sources refresh`) counts as the scheduled one, so the schedule does not
        ask every page again right after it."""
        current = self.get(source.tenant, source.source_id)
        if current is None:
            return
        current.runs += 1
        current.last_run_at = time.time()
        current.last_started_at = started_at
        current.last_report = {k: float(v) for k, v in report.items()
                               if isinstance(v, int | float)}  # fmt: skip
        pipe = self._redis.pipeline()
        pipe.hset(self._key(source.tenant), source.source_id, current.model_dump_json())
        if started_at is not None:  # XX: a source removed meanwhile stays unscheduled
            member = self._member(source.tenant, source.source_id)
            pipe.zadd(_DUE, {member: started_at + current.every_s}, xx=True, gt=True)
        pipe.execute()

    def tenants_sources(self) -> list[Source]:
        """Every scheduled source of every tenant (for operators and tests)."""
        members = cast(list[str], self._redis.zrange(_DUE, 0, -1))
        found = [self.get(*m.split("/", 1)) for m in members]
        return [s for s in found if s is not None]


# -- discovery: a source's page URLs -------------------------------------------------------
XML_TYPES = frozenset({"application/xml", "text/xml", "application/rss+xml",
                       "application/atom+xml", "application/x-xml"})  # fmt: skip
_PAGE_TYPES = frozenset({"text/html", "application/xhtml+xml", "text/plain"})
_XML_HINT = re.compile(r"(\.xml$|sitemap|/feed|/rss|atom)", re.I)
MAX_SITEMAP_DEPTH = 2


@dataclass
class Discovery:
    """The page URLs of a source; `complete` when a sitemap listed them all (drop detection);
    `skipped`: sitemap index entries the network guard refused ("<url>: <reason>")."""

    urls: list[str]
    complete: bool
    skipped: list[str] = field(default_factory=list)


def discover_urls(source: Source, fetcher: ConditionalFetcher, *, max_pages: int) -> Discovery:
    """The page URLs a source names: itself, its sitemap's (recursively) or its feed's."""
    kind = source.kind
    if kind == "page" or (kind == "auto" and not _XML_HINT.search(urlsplit(source.url).path)):
        return Discovery([source.url], complete=False)
    download = fetcher.fetch(source.url, media_types=XML_TYPES | _PAGE_TYPES)
    root = _parse_xml(download.body)
    if root is None or _local(root.tag) not in ("urlset", "sitemapindex", "rss", "feed", "RDF"):
        return Discovery([source.url], complete=False)  # an ordinary page after all
    if _local(root.tag) in ("urlset", "sitemapindex"):
        skipped: list[str] = []
        urls = _sitemap_urls(root, download.final_url, fetcher, max_pages=max_pages, depth=0,
                             skipped=skipped)  # fmt: skip
        # A skipped sitemap's pages are unlisted, not gone: no drops from this run.
        complete = len(urls) < max_pages and not skipped
        return Discovery(_unique(urls)[:max_pages], complete=complete, skipped=skipped)
    return Discovery(_unique(_feed_urls(root, download.final_url))[:max_pages], complete=False)


def _parse_xml(body: bytes) -> Any:
    # No entities, no DTDs, no network: a sitemap is data, never a billion-laughs bomb.
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                             huge_tree=False, recover=True)  # fmt: skip
    try:
        return etree.fromstring(body, parser)
    except etree.XMLSyntaxError:
        return None


def _local(tag: object) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _sitemap_urls(
    root: Any,
    base: str,
    fetcher: ConditionalFetcher,
    *,
    max_pages: int,
    depth: int,
    skipped: list[str],
) -> list[str]:
    locs = [urljoin(base, (el.text or "").strip()) for el in root.iter()
            if _local(el.tag) == "loc" and (el.text or "").strip()]  # fmt: skip
    if _local(root.tag) == "urlset":
        return locs[:max_pages]
    urls: list[str] = []
    for child in locs:  # a sitemap index: each <loc> is another sitemap
        if depth >= MAX_SITEMAP_DEPTH or len(urls) >= max_pages:
            break
        try:
            download = fetcher.fetch(child, media_types=XML_TYPES)
        except BlockedURL as exc:  # one bad entry (a private address): skip it, not the index
            skipped.append(f"{child}: {exc}")
            continue
        sub = _parse_xml(download.body)
        if sub is not None and _local(sub.tag) in ("urlset", "sitemapindex"):
            found = _sitemap_urls(sub, download.final_url, fetcher, max_pages=max_pages - len(urls),
                                  depth=depth + 1, skipped=skipped)  # fmt: skip
            urls += found
    return urls


def _feed_urls(root: Any, base: str) -> list[str]:
    urls = []
    for el in root.iter():
        name = _local(el.tag)
        if name == "item":  # RSS 2.0 / RSS 1.0
            link = next((c for c in el if _local(c.tag) == "link"), None)
            if link is not None and (link.text or "").strip():
                urls.append(urljoin(base, link.text.strip()))
        elif name == "entry":  # Atom: the alternate link
            links = [c for c in el if _local(c.tag) == "link"]
            best = next((c for c in links if c.get("rel", "alternate") == "alternate"), None)
            if best is not None and best.get("href"):
                urls.append(urljoin(base, best.get("href")))
    return urls


def _unique(urls: list[str]) -> list[str]:
    return list(dict.fromkeys(u for u in urls if u.startswith(("http://", "https://"))))
