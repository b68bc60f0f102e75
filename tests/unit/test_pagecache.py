"""The URL cache of fetched pages and the search-results cache (fakeredis)."""

from __future__ import annotations

from datetime import UTC, datetime

import fakeredis
import redis

from tests.factories import make_page
from webctx.models import Page, SearchResult
from webctx.pagecache import PageCache, SearchCache


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
