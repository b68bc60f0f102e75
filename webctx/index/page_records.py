"""The index's page records: per tenant, each URL's current page (content hash, validators,
misses), in Redis.

    webctx:index:<tenant>:pages   hash  url -> PageRecord JSON (hash, validators, misses)
    webctx:index:refs:<sha>       set   "<tenant> <url>" entries pointing at that hash
    webctx:index:page:<sha>       str   the Page (text and metadata), while referenced
    webctx:index:graveyard        zset  sha -> when its points may be deleted

A record moves only through `commit`, which also moves the tenant's live marks in the
store and publishes a new generation in the same MULTI (`webctx.index.generations`), so a search
sees each page whole, old or new, never empty and never mixed. The old hash's points are
deleted `grace_s` later, and only if no URL of any tenant points at them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import redis
from pydantic import BaseModel

from webctx.index.generations import (
    Change,
    Commit,
    Generations,
    live_map,
    mark,
    site_of,
    tenant_key,
)
from webctx.models import Page
from webctx.protocols import IndexScope, IndexWriter

_GRAVEYARD = "webctx:index:graveyard"
_BATCH = 500


class PageRecord(BaseModel):
    """What the index knows of one URL of a tenant."""

    url: str
    source_id: str
    content_sha256: str
    model: str
    etag: str | None = None
    last_modified: str | None = None
    fetched_at: float
    """When the body was last confirmed current (200 with the same text, or 304)."""
    changed_at: float
    misses: int = 0
    chunks: int = 0
    title: str = ""
    site: str = ""
    published: str | None = None


@dataclass
class _Ticket:
    """One commit request waiting for the tenant's lock (or for another thread's batch)."""

    url: str
    record: PageRecord | None
    page: Page | None
    grace_s: float
    old: str | None = None
    done: bool = False
    error: BaseException | None = None


Seen = tuple[str, PageRecord]
"""A record as read (its raw JSON, to compare-and-set against) and parsed."""


class PageRecords:
    """Every tenant's page records (URL -> its current page), in Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self.generations = Generations(client)
        self._queue_lock = threading.Lock()
        self._queues: dict[str, list[_Ticket]] = {}
        self._records_script = client.register_script(_RECORDS)

    def _pages(self, tenant: str) -> str:
        return f"webctx:index:{tenant}:pages"

    @staticmethod
    def _refs(sha: str) -> str:
        return f"webctx:index:refs:{sha}"

    @staticmethod
    def _page(sha: str) -> str:
        return f"webctx:index:page:{sha}"

    def get(self, tenant: str, url: str) -> PageRecord | None:
        """The current record of one URL."""
        raw = self._redis.hget(self._pages(tenant), url)
        return PageRecord.model_validate_json(cast(str, raw)) if raw else None

    def pages(self, tenant: str) -> dict[str, PageRecord]:
        """url -> record of every indexed page of the tenant, read at one instant."""
        raw = cast(dict[str, str], self._redis.hgetall(self._pages(tenant)))
        return {url: PageRecord.model_validate_json(v) for url, v in raw.items()}

    def seen(self, tenant: str, urls: Sequence[str]) -> dict[str, Seen]:
        """url -> (raw, record) of those of `urls` that are indexed (HMGET in batches)."""
        out: dict[str, Seen] = {}
        for start in range(0, len(urls), _BATCH):
            batch = list(urls[start : start + _BATCH])
            values = cast(list[str | None], self._redis.hmget(self._pages(tenant), batch))
            for url, raw in zip(batch, values, strict=True):
                if raw:
                    out[url] = (raw, PageRecord.model_validate_json(raw))
        return out

    def urls(self, tenant: str) -> list[str]:
        """Every indexed URL of the tenant."""
        return cast(list[str], self._redis.hkeys(self._pages(tenant)))

    def stored_page(self, sha: str) -> Page | None:
        """The stored Page of a content hash, while some URL points at it."""
        raw = self._redis.get(self._page(sha))
        return Page.model_validate_json(cast(str, raw)) if raw else None

    def touch(self, tenant: str, record: PageRecord) -> None:
        """Rewrite a record whose content hash did not change (validators, times, misses)."""
        self._redis.hset(self._pages(tenant), record.url, record.model_dump_json())

    def touch_many(self, tenant: str, updates: Sequence[tuple[str, PageRecord]]) -> int:
        """Rewrite records, each only if still exactly as read (raw JSON): a record some
        other run moved meanwhile is left alone. One round trip per 500; returns how many."""
        written = 0
        for start in range(0, len(updates), _BATCH):
            args: list[str] = []
            for raw, record in updates[start : start + _BATCH]:
                args += [record.url, raw, record.model_dump_json()]
            written += int(cast(int, self._redis.eval(_TOUCH, 1, self._pages(tenant), *args)))
        return written

    def revive(self, sha: str) -> None:
        """A hash about to be pointed at again must not be swept meanwhile."""
        self._redis.zrem(_GRAVEYARD, sha)

    # -- record moves: the commit protocol -------------------------------------------------
    def commit(
        self,
        tenant: str,
        url: str,
        *,
        store: IndexWriter,
        record: PageRecord | None,
        page: Page | None = None,
        grace_s: float,
    ) -> str | None:
        """Point `url` at `record` (None: remove it), with the store's live marks and a new
        generation when what the tenant sees changes. Points must be stored first.
        Returns the hash the URL pointed at before (None if it was not indexed).

        Commits of one tenant queue for its lock; the holder commits every one queued
        meanwhile in one batch (one generation, one journal, one MULTI)."""
        ticket = _Ticket(url, record, page, grace_s)
        with self._queue_lock:
            self._queues.setdefault(tenant, []).append(ticket)
        with self.generations.locked(tenant):
            if not ticket.done:
                with self._queue_lock:
                    batch, self._queues[tenant] = self._queues[tenant], []
                try:
                    self._commit_batch(tenant, batch, store)
                except BaseException as exc:
                    for other in batch:
                        other.error, other.done = exc, True
                    raise
        if ticket.error is not None:
            raise ticket.error
        return ticket.old

    def _commit_batch(self, tenant: str, batch: list[_Ticket], store: IndexWriter) -> None:
        self._recover(tenant, store)
        urls = list(dict.fromkeys(t.url for t in batch))
        raws = cast(list[str | None], self._redis.hmget(self._pages(tenant), urls))
        current = {u: PageRecord.model_validate_json(raw).content_sha256
                   for u, raw in zip(urls, raws, strict=True) if raw}  # fmt: skip
        changes, sites = [], {}
        for ticket in batch:
            ticket.old = current.get(ticket.url)
            new = ticket.record.content_sha256 if ticket.record else None
            if new is None and ticket.old is None:
                ticket.done = True
                continue
            if ticket.record is not None and new is not None:
                current[ticket.url] = new
                sites[new] = ticket.record.site
            else:
                current.pop(ticket.url, None)
            changes.append(Change(
                url=ticket.url, old_sha=ticket.old, new_sha=new,
                record=ticket.record.model_dump_json() if ticket.record else None,
                page=ticket.page.model_dump_json() if ticket.page else None,
            ))  # fmt: skip
        if changes:
            plan = self._plan(tenant, changes, sites, grace_s=max(t.grace_s for t in batch))
            if plan.live or plan.dead:
                self.generations.journal(tenant, plan)
                mark(store, tenant, plan)
            self._apply(tenant, plan)
        for ticket in batch:
            ticket.done = True

    def _plan(
        self, tenant: str, changes: list[Change], sites: dict[str, str], *, grace_s: float
    ) -> Commit:
        """The marks a batch needs: hashes the tenant starts or stops pointing at."""
        touched = list({h for c in changes for h in (c.old_sha, c.new_sha) if h})
        pipe = self._redis.pipeline(transaction=False)
        for sha in touched:
            pipe.smembers(self._refs(sha))
        pipe.get(self.generations.key(tenant))
        *found, raw_gen = pipe.execute()
        mine = f"{tenant} "
        before = {sha: {m for m in members if m.startswith(mine)}
                  for sha, members in zip(touched, found, strict=True)}  # fmt: skip
        after = {sha: set(members) for sha, members in before.items()}
        for change in changes:
            member = f"{tenant} {change.url}"
            if change.old_sha and change.old_sha != change.new_sha:
                after[change.old_sha].discard(member)
            if change.new_sha:
                after[change.new_sha].add(member)
        live = live_map({h: sites.get(h, "") for h in touched if after[h] and not before[h]})
        dead = [h for h in touched if before[h] and not after[h]]
        published = int(raw_gen) if raw_gen is not None else 0
        return Commit(generation=published + 1 if live or dead else published,
                      changes=changes, live=live, dead=dead, grace_s=grace_s)  # fmt: skip

    def _apply(self, tenant: str, plan: Commit) -> None:
        """The record switches and the publication, in one MULTI (idempotent: replayable)."""
        pipe = self._redis.pipeline(transaction=True)
        for change in plan.changes:
            member = f"{tenant} {change.url}"
            if change.record is not None and change.new_sha:
                if change.page is not None:
                    pipe.set(self._page(change.new_sha), change.page)
                pipe.sadd(self._refs(change.new_sha), member)
                pipe.hset(self._pages(tenant), change.url, change.record)
            else:
                pipe.hdel(self._pages(tenant), change.url)
            if change.old_sha and change.old_sha != change.new_sha:
                pipe.srem(self._refs(change.old_sha), member)
                pipe.zadd(_GRAVEYARD, {change.old_sha: time.time() + plan.grace_s})
        if plan.live or plan.dead:
            self.generations.publish(pipe, tenant, plan.generation)
        pipe.execute()

    def _recover(self, tenant: str, store: IndexWriter) -> None:
        """Under the lock: finish a commit a dead process left half done; mark a tenant
        indexed before generations existed (every current page live from generation 1)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self.generations.journal_key(tenant))
        pipe.get(self.generations.key(tenant))
        pipe.hlen(self._pages(tenant))
        journal, generation, pages = pipe.execute()
        if journal:
            pending = Commit.model_validate_json(journal)
            mark(store, tenant, pending)
            self._apply(tenant, pending)
        if generation is None and pages and not journal:
            records = self.pages(tenant).values()
            plan = Commit(generation=1, live=live_map({r.content_sha256: r.site
                                                       for r in records}))  # fmt: skip
            mark(store, tenant, plan)
            pipe = self._redis.pipeline(transaction=True)
            self.generations.publish(pipe, tenant, 1)
            pipe.execute()

    def drop(
        self, tenant: str, url: str, *, store: IndexWriter, grace_s: float
    ) -> str | None:
        """Remove a URL from the index; its points go after the grace period."""
        return self.commit(tenant, url, store=store, record=None, grace_s=grace_s)

    def drop_source(
        self, tenant: str, source_id: str, *, store: IndexWriter, grace_s: float
    ) -> int:
        """Remove every page a source brought in; returns how many."""
        urls = [u for u, rec in self.pages(tenant).items() if rec.source_id == source_id]
        return sum(1 for url in urls if self.drop(tenant, url, store=store, grace_s=grace_s))

    def sweepable(self, *, now: float | None = None) -> list[str]:
        """Hashes past their grace period that nothing points at; taken off the graveyard."""
        now = time.time() if now is None else now
        due = cast(list[str], self._redis.zrangebyscore(_GRAVEYARD, "-inf", now))
        taken: list[str] = []
        for sha in due:
            with self._redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self._refs(sha))  # type: ignore[no-untyped-call]
                    referenced = bool(pipe.scard(self._refs(sha)))
                    pipe.multi()
                    pipe.zrem(_GRAVEYARD, sha)
                    if not referenced:
                        pipe.delete(self._page(sha))
                    removed = pipe.execute()[0]
                except redis.WatchError:
                    continue  # pointed at again meanwhile: keep it
            if removed and not referenced:
                taken.append(sha)  # this sweeper took it off, not a concurrent one
        return taken

    # -- what a search sees ---------------------------------------------------------------
    def scope(
        self,
        tenant: str,
        *,
        store: IndexWriter,
        site: str | None = None,
        source_id: str | None = None,
        published_from: str | None = None,
        published_to: str | None = None,
    ) -> IndexScope | None:
        """The store filter of a search: the published generation (one GET), plus, for a
        source or date filter only, the matching pages' hashes read in the same MULTI."""
        hashes: list[str] | None = None
        domain = site is not None and is_domain(site)
        if source_id or published_from or published_to or domain:
            pipe = self._redis.pipeline(transaction=True)
            pipe.get(self.generations.key(tenant))
            pipe.hgetall(self._pages(tenant))
            raw_gen, raw_pages = pipe.execute()
            records = [PageRecord.model_validate_json(v) for v in raw_pages.values()]
            hashes = sorted(select(records, site=site if domain else None,
                                   source_id=source_id, published_from=published_from,
                                   published_to=published_to))  # fmt: skip
            generation = int(raw_gen) if raw_gen is not None else None
            if not hashes:
                return None
        else:
            generation = self.generations.published(tenant)
        if generation is None:
            if not self._redis.hlen(self._pages(tenant)):
                return None
            with self.generations.locked(tenant):
                self._recover(tenant, store)
            generation = self.generations.published(tenant) or 0
        return IndexScope(tenant_key(tenant), generation,
                          site=site_of(site) if site and not domain else None,
                          content_sha256s=hashes)  # fmt: skip

    def records_of(self, tenant: str, hashes: Sequence[str]) -> dict[str, PageRecord]:
        """sha -> a record of the tenant pointing at it (a search's hits' metadata), read in
        one round trip; a hash switched away from since the search is described from its
        stored Page."""
        unique = list(dict.fromkeys(hashes))
        if not unique:
            return {}
        raws = cast(list[str | None], self._records_script(
            keys=[self._pages(tenant), *(self._refs(sha) for sha in unique)],
            args=[f"{tenant} ", *unique],
        ))  # fmt: skip
        return {sha: PageRecord.model_validate_json(raw) if raw else self._described(sha)
                for sha, raw in zip(unique, raws, strict=True)}  # fmt: skip

    def _described(self, sha: str) -> PageRecord:
        page = self.stored_page(sha)
        now = time.time()
        if page is None:
            return PageRecord(url="", source_id="", content_sha256=sha, model="",
                               fetched_at=now, changed_at=now)  # fmt: skip
        return PageRecord(url=page.url, source_id="", content_sha256=sha, model="",
                           fetched_at=now, changed_at=now, title=page.title, site=page.site,
                           published=page.published)  # fmt: skip

    def current(
        self,
        tenant: str,
        *,
        site: str | None = None,
        source_id: str | None = None,
        published_from: str | None = None,
        published_to: str | None = None,
    ) -> dict[str, PageRecord]:
        """content_sha256 -> record of the tenant's current pages matching the filters."""
        return select(self.pages(tenant).values(), site=site, source_id=source_id,
                      published_from=published_from, published_to=published_to)  # fmt: skip

    def fresh_page(
        self, tenant: str, url: str, *, max_age_s: float, model: str, now: float | None = None
    ) -> Page | None:
        """The indexed page of `url` if confirmed current within `max_age_s` (same model)."""
        copy = self.confirmed_copy(tenant, url, max_age_s=max_age_s, model=model, now=now)
        return copy[0] if copy else None

    def confirmed_copy(
        self, tenant: str, url: str, *, max_age_s: float, model: str, now: float | None = None
    ) -> tuple[Page, float] | None:
        """The indexed page of `url` and when a run last confirmed it current (epoch
        seconds), if that is within `max_age_s` (same model)."""
        record = self.get(tenant, url)
        now = time.time() if now is None else now
        if record is None or record.model != model or now - record.fetched_at > max_age_s:
            return None
        page = self.stored_page(record.content_sha256)
        return (page, record.fetched_at) if page is not None else None


def is_domain(site: str) -> bool:
    """True for a site filter that names a host (`example.org`), not a display name."""
    value = site.strip().lower()
    return "." in value and not any(c.isspace() for c in value)


def site_matches(record: PageRecord, site: str) -> bool:
    """The page's display name is `site`, or, for a domain, its URL's host is that domain
    or one of its subdomains (`example.org` matches www.example.org)."""
    if site_of(record.site) == site_of(site):
        return True
    if not is_domain(site):
        return False
    domain = site_of(site).removeprefix("www.").rstrip(".")
    host = (urlsplit(record.url).hostname or "").rstrip(".")
    return host == domain or host.endswith("." + domain)


def select(
    records: Iterable[PageRecord],
    *,
    site: str | None = None,
    source_id: str | None = None,
    published_from: str | None = None,
    published_to: str | None = None,
) -> dict[str, PageRecord]:
    """content_sha256 -> record of the records matching the filters."""
    out: dict[str, PageRecord] = {}
    for record in records:
        if site and not site_matches(record, site):
            continue
        if source_id and record.source_id != source_id:
            continue
        if (published_from or published_to) and not record.published:
            continue
        published = record.published or ""
        if published_from and published < published_from:
            continue
        if published_to and published[: len(published_to)] > published_to:
            continue
        out.setdefault(record.content_sha256, record)
    return out


_TOUCH = """
local n = 0
for i = 1, #ARGV, 3 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
    n = n + 1
  end
end
return n
"""

# Per hash (KEYS[2..], ARGV[2..]): the first URL of the tenant (ARGV[1] is "<tenant> ") in
# the hash's refs, in URL order, whose record still points at that hash; false if none.
_RECORDS = """
local out = {}
local prefix = ARGV[1]
for i = 2, #KEYS do
  local urls = {}
  for _, member in ipairs(redis.call('SMEMBERS', KEYS[i])) do
    if string.sub(member, 1, #prefix) == prefix then
      urls[#urls + 1] = string.sub(member, #prefix + 1)
    end
  end
  table.sort(urls)
  local found = false
  for _, url in ipairs(urls) do
    local raw = redis.call('HGET', KEYS[1], url)
    if raw and cjson.decode(raw)['content_sha256'] == ARGV[i] then
      found = raw
      break
    end
  end
  out[#out + 1] = found
end
return out
"""
