"""The keyed search adapters (brave, tavily, exa, serper) against loopback fakes of each
vendor's API (webctx/devweb/vendors.py): request fields, auth, paging, result counts, the
recency filter, and each error answer mapped onto the webctx error tree."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from webctx.adapters.brave_search import BraveSearch
from webctx.adapters.exa_search import ExaSearch
from webctx.adapters.serper_search import SerperSearch
from webctx.adapters.tavily_search import TavilySearch
from webctx.devweb.searxng import SearchDoc
from webctx.devweb.server import LoopbackServer
from webctx.devweb.vendors import VENDORS, Vendor, VendorControl, make_vendor_app, vendor_control
from webctx.errors import ProviderError, ProviderUnavailable, RateLimited
from webctx.protocols import SearchProvider

KEY = "key-123"
RECENT = (datetime.now(UTC) - timedelta(days=2)).date().isoformat()
OLD = "2019-01-01"
DOCS = [
    SearchDoc("https://celery.example/retries", "Celery task retries",
              "Retry a Celery task with exponential backoff and jitter. " * 5, RECENT),
    SearchDoc("https://redis.example/persistence", "Redis persistence",
              "AOF and RDB snapshots keep Celery's Redis broker durable.", OLD),
] + [SearchDoc(f"https://filler.example/{i}", f"Filler {i}", f"celery filler page {i}")
     for i in range(45)]  # fmt: skip
CLASSES = {"brave": BraveSearch, "tavily": TavilySearch, "exa": ExaSearch, "serper": SerperSearch}
KEY_VARS = {"brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY", "exa": "EXA_API_KEY",
            "serper": "SERPER_API_KEY"}  # fmt: skip

Fake = tuple[LoopbackServer, VendorControl]


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, Fake]]:
    servers = {}
    for vendor in VENDORS:
        app = make_vendor_app(vendor, DOCS, api_key=KEY)
        servers[vendor] = (LoopbackServer(app).start(), vendor_control(app))
    yield servers
    for server, _ in servers.values():
        server.stop()


@pytest.fixture(params=VENDORS)
def vendor(request: pytest.FixtureRequest, fakes: dict[str, Fake]) -> Iterator[Vendor]:
    fakes[request.param][1].recover()
    yield request.param
    fakes[request.param][1].recover()


def adapter(vendor: str, fakes: dict[str, Fake], *, key: str = KEY) -> SearchProvider:
    search: SearchProvider = CLASSES[vendor](key, base_url=fakes[vendor][0].url, timeout_s=5)
    return search


def test_each_adapter_is_a_search_provider(vendor: Vendor, fakes: dict[str, Fake]) -> None:
    search = adapter(vendor, fakes)
    assert isinstance(search, SearchProvider) and search.name == vendor


def test_results_come_best_first_up_to_the_limit(vendor: Vendor, fakes: dict[str, Fake]) -> None:
    results = adapter(vendor, fakes).search("celery retries backoff", limit=5)
    assert len(results) == 5
    assert results[0].url == "https://celery.example/retries"
    assert [r.rank for r in results] == list(range(5))
    assert all(r.provider == vendor and r.title for r in results)
    assert "<strong>" not in results[0].snippet  # Brave's highlight markup is dropped


def test_the_key_goes_in_the_vendors_header(vendor: Vendor, fakes: dict[str, Fake]) -> None:
    adapter(vendor, fakes).search("celery", limit=3)
    headers = fakes[vendor][1].last["headers"]
    expected = {"brave": ("x-subscription-token", KEY),
                "tavily": ("authorization", f"Bearer {KEY}"),
                "exa": ("x-api-key", KEY), "serper": ("x-api-key", KEY)}[vendor]  # fmt: skip
    assert headers[expected[0]] == expected[1]


def test_the_result_count_is_sent_in_the_vendors_field(
    vendor: Vendor, fakes: dict[str, Fake]
) -> None:
    adapter(vendor, fakes).search("celery", limit=7)
    last = fakes[vendor][1].last
    sent = {"brave": lambda: last["params"]["count"],
            "tavily": lambda: last["body"]["max_results"],
            "exa": lambda: last["body"]["numResults"],
            "serper": lambda: last["body"]["num"]}  # fmt: skip
    assert int(sent[vendor]()) == 7


def test_a_refused_key_names_the_provider_and_its_variable(
    vendor: Vendor, fakes: dict[str, Fake]
) -> None:
    with pytest.raises(ProviderError) as caught:
        adapter(vendor, fakes, key="wrong").search("celery", limit=3)
    message = str(caught.value)
    assert message.startswith(f"{vendor}: the API key was refused")
    assert KEY_VARS[vendor] in message and f"WEBCTX_{vendor.upper()}__API_KEY" in message
    assert "wrong" not in message  # never the key itself


def test_a_429_is_rate_limited_with_the_vendors_wait(
    vendor: Vendor, fakes: dict[str, Fake]
) -> None:
    fakes[vendor][1].fail_next(fault="rate")
    with pytest.raises(RateLimited) as caught:
        adapter(vendor, fakes).search("celery", limit=3)
    if vendor == "brave":  # X-RateLimit-Reset: the per-second window's reset
        assert caught.value.retry_after == 1.0
        assert caught.value.rate_limits["x-ratelimit-remaining"] == "0, 1000"
    elif vendor == "tavily":  # retry-after, seconds
        assert caught.value.retry_after == 2.0
    else:  # Exa and Serper document no wait: the breaker's backoff paces
        assert caught.value.retry_after is None


def test_brave_with_its_monthly_quota_spent_asks_for_the_months_wait(
    fakes: dict[str, Fake],
) -> None:
    fakes["brave"][1].fail_next(fault="spent")
    with pytest.raises(RateLimited) as caught:
        adapter("brave", fakes).search("celery", limit=3)
    assert caught.value.retry_after == 1419704.0  # past any budget: the breaker opens


@pytest.mark.parametrize("spender", ["tavily", "exa", "serper"])
def test_spent_credits_are_a_provider_error(spender: Vendor, fakes: dict[str, Fake]) -> None:
    fakes[spender][1].fail_next(fault="spent")
    with pytest.raises(ProviderError, match="credits or plan limit are spent"):
        adapter(spender, fakes).search("celery", limit=3)


def test_a_5xx_is_unavailable(vendor: Vendor, fakes: dict[str, Fake]) -> None:
    fakes[vendor][1].fail_next(fault="server")
    with pytest.raises(ProviderUnavailable) as caught:
        adapter(vendor, fakes).search("celery", limit=3)
    assert caught.value.kind == "status" and caught.value.detail.startswith("HTTP 5")


def test_a_malformed_body_is_a_provider_error(vendor: Vendor, fakes: dict[str, Fake]) -> None:
    fakes[vendor][1].fail_next(fault="malformed")
    with pytest.raises(ProviderError, match="not JSON"):
        adapter(vendor, fakes).search("celery", limit=3)


def test_an_endpoint_that_refuses_connections_is_unreachable(vendor: Vendor) -> None:
    app = make_vendor_app(vendor, DOCS, api_key=KEY)
    server = LoopbackServer(app).start()
    server.stop()
    search = CLASSES[vendor](KEY, base_url=server.url, timeout_s=2)
    with pytest.raises(ProviderUnavailable) as caught:
        search.search("celery", limit=3)
    assert caught.value.kind == "unreachable"


def test_recency_is_sent_in_the_vendors_field_and_filters(
    vendor: Vendor, fakes: dict[str, Fake]
) -> None:
    results = adapter(vendor, fakes).search("celery redis", limit=10, recency_days=7)
    assert [r.url for r in results] == ["https://celery.example/retries"]
    last = fakes[vendor][1].last
    if vendor == "brave":
        assert last["params"]["freshness"] == "pw"
    elif vendor == "tavily":
        assert last["body"]["time_range"] == "week"
    elif vendor == "serper":
        assert last["body"]["tbs"] == "qdr:w"
    else:  # Exa takes an exact date
        since = datetime.fromisoformat(last["body"]["startPublishedDate"].replace("Z", "+00:00"))
        assert abs((datetime.now(UTC) - since) - timedelta(days=7)) < timedelta(minutes=5)


def test_brave_pages_by_offset_past_twenty(fakes: dict[str, Fake]) -> None:
    control = fakes["brave"][1]
    before = control.requests
    results = adapter("brave", fakes).search("celery", limit=30)
    assert len(results) == 30 and len({r.url for r in results}) == 30
    assert control.requests - before == 2
    assert control.last["params"]["offset"] == "1" and control.last["params"]["count"] == "20"


def test_brave_stops_paging_when_nothing_more_is_available(fakes: dict[str, Fake]) -> None:
    control = fakes["brave"][1]
    before = control.requests
    assert adapter("brave", fakes).search("persistence", limit=40) != []
    assert control.requests - before == 1


def test_no_hits_is_an_empty_list(vendor: Vendor, fakes: dict[str, Fake]) -> None:
    assert adapter(vendor, fakes).search("zzzunmatched", limit=5) == []


@pytest.mark.parametrize("counted", ["tavily", "exa"])
def test_tavily_and_exa_return_the_pages_text(counted: Vendor, fakes: dict[str, Fake]) -> None:
    results = adapter(counted, fakes).search("celery retries backoff", limit=3)
    assert results[0].content == DOCS[0].text[:10_000]


def test_tavily_without_raw_content_returns_no_text(fakes: dict[str, Fake]) -> None:
    search = TavilySearch(KEY, base_url=fakes["tavily"][0].url, include_raw_content=False)
    results = search.search("celery retries", limit=3)
    assert fakes["tavily"][1].last["body"]["include_raw_content"] is False
    assert all(r.content is None for r in results)


def test_exa_asks_for_the_configured_text_length(fakes: dict[str, Fake]) -> None:
    search = ExaSearch(KEY, base_url=fakes["exa"][0].url, text_max_chars=40)
    results = search.search("celery retries backoff", limit=3)
    assert fakes["exa"][1].last["body"]["contents"] == {"text": {"maxCharacters": 40}}
    assert results[0].content == DOCS[0].text[:40]


@pytest.mark.parametrize("silent", ["brave", "serper"])
def test_brave_and_serper_give_no_page_text(silent: Vendor, fakes: dict[str, Fake]) -> None:
    assert all(r.content is None for r in adapter(silent, fakes).search("celery", limit=3))
