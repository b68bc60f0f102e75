"""Search stage: URL normalisation, merging, and SearxngSearch against a loopback SearxNG."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from ddgs.ddgs import DDGS
from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException

from webctx.adapters.ddgs_search import DdgsSearch
from webctx.adapters.searxng_search import SearxngSearch, parse_retry_after
from webctx.devweb.searxng import SearchDoc, SearxngControl, make_searxng_app, searxng_control
from webctx.devweb.server import LoopbackServer
from webctx.errors import ProviderError, ProviderUnavailable, RateLimited
from webctx.models import SearchResult
from webctx.protocols import SearchProvider
from webctx.stages.search import merge_results, normalize_url, search_query

DOCS = [
    SearchDoc(
        "https://celery.example/retries", "Celery task retries", "Retry a task with backoff."
    ),
    SearchDoc("https://redis.example/persistence", "Redis persistence", "AOF and RDB snapshots."),
    SearchDoc(
        "https://blog.example/celery-redis", "Celery on Redis", "Visibility timeout, celery."
    ),
] + [
    SearchDoc(f"https://filler.example/{i}", f"Filler {i}", f"celery filler page {i}")
    for i in range(25)
]


Searxng = tuple[LoopbackServer, SearxngControl]


@pytest.fixture(scope="module")
def searxng() -> Iterator[Searxng]:
    app = make_searxng_app(DOCS, results_per_page=10)
    with LoopbackServer(app) as server:
        yield server, searxng_control(app)


def result(url: str, rank: int, query: str = "q") -> SearchResult:
    return SearchResult(url=url, title=url, rank=rank, query=query, provider="test")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("HTTPS://Example.COM:443/a/", "https://example.com/a"),
        ("http://example.com:80", "http://example.com/"),
        ("http://example.com:8080/x", "http://example.com:8080/x"),
        ("https://example.com/p?b=2&a=1#section", "https://example.com/p?a=1&b=2"),
        ("https://example.com/p?utm_source=x&utm_medium=y&id=7", "https://example.com/p?id=7"),
        ("https://example.com/?gclid=1&fbclid=2&mc_cid=3&mc_eid=4", "https://example.com/"),
        ("https://Example.com./", "https://example.com/"),
        ("not a url", "not a url"),
    ],
)
def test_normalize_url_canonicalises(url: str, expected: str) -> None:
    assert normalize_url(url) == expected


def test_merge_keeps_best_rank_and_orders_ties_by_query_count() -> None:
    merged = merge_results(
        [
            [result("https://a.example/x?utm_source=q1", 3), result("https://b.example/", 0)],
            [result("https://c.example/", 0), result("https://A.example/x/", 1)],
            [result("https://c.example/#top", 2)],
        ]
    )
    assert [r.url for r in merged] == [
        "https://c.example/",  # rank 0, found by two queries
        "https://b.example/",  # rank 0, found by one
        "https://A.example/x/",  # best rank 1 (from the second list) wins over rank 3
    ]


def test_merge_domain_filters_match_subdomains() -> None:
    lists = [
        [
            result("https://docs.python.org/3/", 0),
            result("https://python.org/", 1),
            result("https://notpython.org/", 2),
            result("https://spam.python.org/", 3),
        ]
    ]
    kept = merge_results(lists, include_domains=["Python.org"], exclude_domains=["spam.python.org"])
    assert [r.url for r in kept] == ["https://docs.python.org/3/", "https://python.org/"]


def test_searxng_search_returns_bm25_ranked_results(
    searxng: Searxng,
) -> None:
    server, _ = searxng
    provider = SearxngSearch(server.url, timeout_s=5)
    assert isinstance(provider, SearchProvider)
    results = provider.search("redis persistence", limit=5)
    assert results[0].url == "https://redis.example/persistence"
    assert [r.rank for r in results] == list(range(len(results)))
    assert all(r.provider == "searxng" and r.query == "redis persistence" for r in results)


def test_searxng_search_pages_until_limit(searxng: Searxng) -> None:
    server, control = searxng
    before = control.requests
    results = SearxngSearch(server.url, max_pages=3).search("celery", limit=25)
    assert len(results) == 25
    assert len({r.url for r in results}) == 25
    assert control.requests - before == 3  # 10 per page


def test_searxng_asks_for_the_pages_a_query_needs_at_once() -> None:
    app = make_searxng_app(DOCS, results_per_page=10, latency_s=0.1)
    control = searxng_control(app)
    with LoopbackServer(app) as server:
        provider = SearxngSearch(server.url, timeout_s=5)
        results = provider.search("celery", limit=20)
        assert control.requests == control.in_flight.most == 2  # pages 1 and 2 together
        assert [r.rank for r in results] == list(range(20))
        assert len({r.url for r in results}) == 20
        provider.search("celery", limit=5)
        assert control.requests == 3  # one page holds 5
        control.fail_next(1, status=500)
        with pytest.raises(ProviderUnavailable):
            provider.search("celery", limit=20)


def test_searxng_learns_the_instances_page_size() -> None:
    app = make_searxng_app(DOCS, results_per_page=5, latency_s=0.05)
    control = searxng_control(app)
    with LoopbackServer(app) as server:
        provider = SearxngSearch(server.url, timeout_s=5)
        assert len(provider.search("celery", limit=10)) == 10
        assert control.requests == 2 and control.in_flight.most == 1  # 10 assumed: one by one
        assert len(provider.search("celery", limit=10)) == 10
        assert control.requests == 4 and control.in_flight.most == 2  # 5 seen: both at once


def test_searxng_server_refuses_html_format(searxng: Searxng) -> None:
    server, _ = searxng
    resp = httpx.get(f"{server.url}/search", params={"q": "celery", "format": "html"})
    assert resp.status_code == 403


def test_searxng_500_is_provider_unavailable(
    searxng: Searxng,
) -> None:
    server, control = searxng
    control.fail_next(1, status=500)
    with pytest.raises(ProviderUnavailable):
        SearxngSearch(server.url).search("celery", limit=3)


def test_searxng_429_is_rate_limited_with_retry_after(
    searxng: Searxng,
) -> None:
    server, control = searxng
    control.fail_next(1, status=429, retry_after=7)
    with pytest.raises(RateLimited) as info:
        SearxngSearch(server.url).search("celery", limit=3)
    assert info.value.retry_after == 7


def test_searxng_other_4xx_is_provider_error(
    searxng: Searxng,
) -> None:
    server, control = searxng
    control.fail_next(1, status=403)
    with pytest.raises(ProviderError, match="search.formats"):
        SearxngSearch(server.url).search("celery", limit=3)


def test_searxng_unreachable_is_provider_unavailable() -> None:
    with LoopbackServer(make_searxng_app(DOCS)) as server:
        url = server.url
    with pytest.raises(ProviderUnavailable):
        SearxngSearch(url, timeout_s=2).search("celery", limit=3)


def test_parse_retry_after_accepts_http_date() -> None:
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412500.0) == 10.0
    assert parse_retry_after("garbage") is None


def test_search_query_tags_results(searxng: Searxng) -> None:
    server, _ = searxng
    results = search_query(SearxngSearch(server.url), "celery retries", limit=2)
    assert len(results) == 2
    assert all(r.query == "celery retries" for r in results)


class ScriptedDDGS(DDGS):
    """The third-party DDGS object with its network call replaced by a script."""

    def __init__(self, outcome: list[dict[str, str]] | Exception) -> None:
        super().__init__()
        self.outcome = outcome
        self.calls: list[tuple[str, dict[str, object]]] = []

    def text(self, query: str, **kwargs: object) -> list[dict[str, str]]:
        self.calls.append((query, kwargs))
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


def test_ddgs_maps_rows_and_skips_non_http() -> None:
    fake = ScriptedDDGS(
        [
            {"title": "A", "href": "https://a.example/", "body": "alpha"},
            {"title": "bad", "href": "javascript:alert(1)", "body": ""},
            {"title": "B", "href": "http://b.example/", "body": "beta"},
        ]
    )
    results = DdgsSearch(ddgs=fake).search("q", limit=5)
    assert [(r.url, r.snippet, r.rank, r.provider) for r in results] == [
        ("https://a.example/", "alpha", 0, "ddgs"),
        ("http://b.example/", "beta", 1, "ddgs"),
    ]
    assert fake.calls[0][1]["max_results"] == 5


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (RatelimitException("202 Ratelimit"), RateLimited),
        (TimeoutException("timed out"), ProviderUnavailable),
        (DDGSException("https://html.duckduckgo.com 202 Ratelimit"), RateLimited),
        (DDGSException("ConnectError: boom"), ProviderError),
    ],
)
def test_ddgs_translates_errors(exc: Exception, expected: type[Exception]) -> None:
    with pytest.raises(expected):
        DdgsSearch(ddgs=ScriptedDDGS(exc)).search("q", limit=3)


def test_ddgs_no_results_is_empty_list() -> None:
    provider = DdgsSearch(ddgs=ScriptedDDGS(DDGSException("No results found.")))
    assert provider.search("q", limit=3) == []


def test_recency_limits_searxng_results_to_the_time_range() -> None:
    now = datetime.now(UTC)
    docs = [
        SearchDoc(
            "https://a.example/new",
            "Celery news",
            "celery release",
            (now - timedelta(days=3)).date().isoformat(),
        ),
        SearchDoc(
            "https://a.example/old",
            "Celery history",
            "celery release",
            (now - timedelta(days=400)).date().isoformat(),
        ),
        SearchDoc("https://a.example/undated", "Celery notes", "celery release"),
    ]
    with LoopbackServer(make_searxng_app(docs)) as server:
        recent = SearxngSearch(server.url).search("celery release", limit=10, recency_days=7)
        year = search_query(SearxngSearch(server.url), "celery release", limit=10, recency_days=365)
        every = SearxngSearch(server.url).search("celery release", limit=10)
    assert [r.url for r in recent] == ["https://a.example/new"]
    assert [r.url for r in year] == ["https://a.example/new"]
    assert len(every) == 3


def test_ddgs_receives_the_recency_as_its_timelimit() -> None:
    fake = ScriptedDDGS([{"href": "https://a.example/x", "title": "x", "body": "y"}])
    DdgsSearch(ddgs=fake).search("q", limit=3, recency_days=30)
    DdgsSearch(ddgs=fake).search("q", limit=3)
    assert [kwargs["timelimit"] for _, kwargs in fake.calls] == ["m", None]
