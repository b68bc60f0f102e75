"""The URL cache of fetched pages and the search-results cache (fakeredis)."""

from __future__ import annotations

from datetime import UTC, datetime

import fakeredis
import redis

from tests.factories import make_page
from webctx.jobs.caches import (
    FAILURE_TTL_S,
    REVALIDATE_WINDOWS,
    PageCache,
    RememberedFailure,
    SearchCache,
    StaleEntry,
    StoredPages,
)
from webctx.models import Page, SearchResult


def _client() -> redis.Redis:
    return fakeredis.FakeRedis(decode_responses=True)


def test_a_page_is_fresh_within_its_window_under_any_spelling_of_its_url() -> None:
    cache = PageCache(_client(), ttl_s=3600)
    fetched = datetime.now(UTC)
    page = make_page(url="https://example.org/a", fetched_at=fetched, etag='"v1"')
    cache.remember("https://example.org/a", page)
    stored: dict[str, Page] = {page.content_sha256: page}
    for url in (
        "https://example.org/a",
        "HTTPS://Example.org:443/a#top",
        "https://example.org/a?utm_source=x",
    ):
        assert cache.fresh_page(url, stored.get) == page
    later = fetched.timestamp() + 3601
    assert cache.fresh_sha("https://example.org/a", now=later) is None
    assert cache.fresh_page("https://example.org/other", stored.get) is None


def test_page_cache_is_off_with_a_zero_window() -> None:
    cache = PageCache(_client(), ttl_s=0)
    page = make_page(fetched_at=datetime.now(UTC))
    cache.remember(page.url, page)
    assert cache.fresh_sha(page.url) is None


def test_search_results_are_reused_per_provider_limit_and_query() -> None:
    client = _client()
    cache = SearchCache(client, ttl_s=60, provider="searxng")
    results = [SearchResult(url="https://example.org/a", rank=0, query="q")]
    assert cache.get("Battery  ageing", limit=10) is None
    cache.put("Battery  ageing", results, limit=10)
    assert cache.get("battery ageing", limit=10) == results
    assert cache.get("battery ageing", limit=5) is None
    assert SearchCache(client, ttl_s=60, provider="ddgs").get("battery ageing", limit=10) is None
    cache.put("nothing found", [], limit=10)  # an empty answer may be an outage: not kept
    assert cache.get("nothing found", limit=10) is None


def test_one_caller_claims_a_download_and_the_others_wait_for_its_end() -> None:
    client = _client()
    first, second = PageCache(client, ttl_s=3600), PageCache(client, ttl_s=3600)
    assert first.claim_download("https://example.org/a", hold_s=30)
    assert not second.claim_download("https://EXAMPLE.org/a#x", hold_s=30)
    assert second.claim_download("https://example.org/b", hold_s=30)
    assert not second.wait_download("https://example.org/a", timeout_s=0.2, poll_s=0.05)
    first.release_download("https://example.org/a")
    assert second.wait_download("https://example.org/a", timeout_s=0.2, poll_s=0.05)
    assert second.claim_download("https://example.org/a", hold_s=30)


def test_a_claim_expires_so_a_dead_downloader_does_not_block_the_url() -> None:
    cache = PageCache(_client(), ttl_s=3600)
    assert cache.claim_download("https://example.org/a", hold_s=0.05)
    assert cache.wait_download("https://example.org/a", timeout_s=2, poll_s=0.02)
    assert cache.claim_download("https://example.org/a", hold_s=30)


def test_every_claim_of_dead_downloaders_is_ended_at_once_and_nothing_else() -> None:
    cache = PageCache(_client(), ttl_s=3600)
    for url in ("https://example.org/a", "https://example.org/b"):
        assert cache.claim_download(url, hold_s=300)
    cache.remember("https://example.org/a", make_page(url="https://example.org/a"))
    assert cache.release_all_downloads() == 2
    assert cache.claim_download("https://example.org/a", hold_s=30)  # free at once
    assert cache.entry("https://example.org/a") is not None  # the cache itself is kept


def test_a_failed_download_is_remembered_until_the_page_is_fetched() -> None:
    cache = PageCache(_client(), ttl_s=3600)
    url = "https://example.org/gone"
    cache.remember_failure(url, RememberedFailure("fetch", "http_status", "HTTP 404"))
    assert cache.failure(url) == RememberedFailure("fetch", "http_status", "HTTP 404")
    assert 0 < cache._redis.ttl(cache._failure_key(url)) <= FAILURE_TTL_S
    page = make_page(url=url, fetched_at=datetime.now(UTC))
    cache.remember(url, page)
    assert cache.failure(url) is None and cache.fresh_sha(url) == page.content_sha256
    cache.remember_failure(url, RememberedFailure("fetch", "timeout", "slow"))
    assert cache.failure(url) is None  # a fresh page wins over a later failure


def test_stored_pages_are_known_per_store_model_and_chunking_until_forgotten() -> None:
    client = _client()
    here = StoredPages(client, ttl_s=3600, scope=("/q", "chunks", "m1", "64/0"))
    other_model = StoredPages(client, ttl_s=3600, scope=("/q", "chunks", "m2", "64/0"))
    other_chunks = StoredPages(client, ttl_s=3600, scope=("/q", "chunks", "m1", "256/32"))
    here.mark("sha-a", 12)
    assert here.chunks("sha-a") == 12 and here.chunks("sha-b") is None
    assert other_model.chunks("sha-a") is None and other_chunks.chunks("sha-a") is None
    other_model.mark("sha-a", 12)
    here.forget(["sha-a"])
    assert here.chunks("sha-a") is None and other_model.chunks("sha-a") is None
    off = StoredPages(client, ttl_s=0, scope=("/q",))
    off.mark("sha-c", 1)
    assert off.chunks("sha-c") is None


def test_a_forgotten_store_voids_its_marks_and_keeps_later_ones() -> None:
    client = _client()
    here = StoredPages(client, ttl_s=3600, scope=("/q", "chunks", "m1", "64/0"))
    elsewhere = StoredPages(client, ttl_s=3600, scope=("/other", "chunks", "m1", "64/0"))
    here.mark("sha-a", 12)
    elsewhere.mark("sha-a", 7)
    # A mark written before epochs existed (a bare count) holds until the first reset.
    client.hset("webctx:indexed:sha-b", here.scope, "5")
    assert here.chunks("sha-b") == 5
    here.forget_store()
    assert here.chunks("sha-a") is None and here.chunks("sha-b") is None
    assert elsewhere.chunks("sha-a") == 7  # another store keeps what it holds
    here.mark("sha-a", 12)
    assert here.chunks("sha-a") == 12
    # Another process's view of the same scope agrees (the epoch lives in Redis).
    again = StoredPages(client, ttl_s=3600, scope=("/q", "chunks", "m1", "64/0"))
    assert again.chunks("sha-a") == 12


def test_a_page_past_its_window_is_stale_with_its_validators_until_it_expires() -> None:
    cache = PageCache(_client(), ttl_s=1)
    page = make_page(url="https://example.org/a", fetched_at=datetime.now(UTC), etag='"v1"')
    cache.remember(page.url, page)
    assert cache.stale(page.url) == StaleEntry(page.content_sha256, '"v1"', None)
    assert cache._redis.ttl(cache._key(page.url)) == REVALIDATE_WINDOWS
    assert cache.fresh_sha(page.url, now=page.fetched_at.timestamp() + 2) is None
    bare = make_page(url="https://example.org/b", fetched_at=datetime.now(UTC))
    cache.remember(bare.url, bare)
    assert cache.stale(bare.url) is None  # nothing to revalidate with
