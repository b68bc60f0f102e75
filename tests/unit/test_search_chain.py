"""The search chain (`WEBCTX_SEARCH_PROVIDER=brave,searxng`): a query goes on to the next
provider after an error, a 429 or no answer; a provider whose shared breaker is open is
skipped without a request; when none answers, the chain's error says what each did.

Real adapters against loopback vendor fakes, real breakers on the test Redis."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import redis_url
from webctx.adapters.brave_search import BraveSearch
from webctx.adapters.searxng_search import SearxngSearch
from webctx.adapters.tavily_search import TavilySearch
from webctx.devweb.searxng import SearchDoc, SearxngControl, make_searxng_app, searxng_control
from webctx.devweb.server import LoopbackServer
from webctx.devweb.vendors import VendorControl, make_vendor_app, vendor_control
from webctx.errors import ConfigError, ProviderDown, ProviderError, RateLimited
from webctx.net.breaker import BreakerPolicy, Endpoint, GuardedSearch, ProviderBreaker
from webctx.settings import Settings
from webctx.stages.search_chain import ChainFailed, SearchChain, answer_query
from webctx.workers.search_deps import build_search, search_endpoint

KEY = "k"
DOCS = [SearchDoc(f"https://site.example/{i}", f"Celery page {i}", f"celery retries {i}")
        for i in range(12)]  # fmt: skip
QUICK = BreakerPolicy(outage_s=0.2, rate_limit_budget_s=0.4, cooldown_s=30, probe_lease_s=2)


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url())
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def brave() -> Iterator[tuple[LoopbackServer, VendorControl]]:
    app = make_vendor_app("brave", DOCS, api_key=KEY)
    with LoopbackServer(app) as server:
        yield server, vendor_control(app)


@pytest.fixture
def tavily() -> Iterator[tuple[LoopbackServer, VendorControl]]:
    app = make_vendor_app("tavily", DOCS, api_key=KEY)
    with LoopbackServer(app) as server:
        yield server, vendor_control(app)


@pytest.fixture
def searxng() -> Iterator[tuple[LoopbackServer, SearxngControl]]:
    app = make_searxng_app(DOCS)
    with LoopbackServer(app) as server:
        yield server, searxng_control(app)


def guarded(search: BraveSearch | SearxngSearch | TavilySearch, r: redis.Redis) -> GuardedSearch:
    endpoint = Endpoint("search", search.name, search.base_url, "WEBCTX_X")
    return GuardedSearch(search, ProviderBreaker(r, endpoint, QUICK))


def test_a_failing_first_provider_hands_the_query_to_the_second(brave, searxng) -> None:
    brave[1].fail_next(fault="server")
    chain = SearchChain([BraveSearch(KEY, base_url=brave[0].url), SearxngSearch(searxng[0].url)])
    answer = chain.answer("celery retries", limit=5)
    assert answer.provider == "searxng" and len(answer.results) == 5
    assert all(r.provider == "searxng" for r in answer.results)
    assert [(a.provider, a.outcome) for a in answer.attempts] == [
        ("brave", "failed"), ("searxng", "answered")]  # fmt: skip
    assert "HTTP 500" in answer.attempts[0].error


@pytest.mark.parametrize("fault", ["rate", "auth", "malformed"])
def test_a_429_a_refused_key_or_a_broken_body_hand_on_too(brave, searxng, fault) -> None:
    brave[1].fail_next(fault=fault)
    chain = SearchChain([BraveSearch(KEY, base_url=brave[0].url), SearxngSearch(searxng[0].url)])
    assert chain.answer("celery", limit=3).provider == "searxng"


def test_an_unreachable_first_provider_hands_on(searxng) -> None:
    gone = LoopbackServer(make_vendor_app("brave", DOCS, api_key=KEY)).start()
    gone.stop()
    chain = SearchChain([BraveSearch(KEY, base_url=gone.url, timeout_s=2),
                         SearxngSearch(searxng[0].url)])  # fmt: skip
    assert chain.answer("celery", limit=3).provider == "searxng"


def test_the_first_provider_answers_when_it_can(brave, searxng) -> None:
    chain = SearchChain([BraveSearch(KEY, base_url=brave[0].url), SearxngSearch(searxng[0].url)])
    answer = chain.answer("celery", limit=3)
    assert answer.provider == "brave" and searxng[1].requests == 0


def test_a_provider_found_down_is_skipped_without_a_request(brave, searxng, r) -> None:
    brave[1].fail_always(fault="server")
    first = guarded(BraveSearch(KEY, base_url=brave[0].url), r)
    chain = SearchChain([first, guarded(SearxngSearch(searxng[0].url), r)])
    deadline = time.monotonic() + 10
    while first.breaker.down() is None and time.monotonic() < deadline:  # past outage_s
        chain.answer("celery", limit=3)
        time.sleep(0.05)
    assert first.breaker.down() is not None
    sent = brave[1].requests
    answer = chain.answer("celery", limit=3)
    assert brave[1].requests == sent  # skipped at once: nothing sent
    assert answer.provider == "searxng"
    assert answer.attempts[0].outcome == "skipped" and "HTTP 500" in answer.attempts[0].error


def test_every_provider_down_is_provider_down_naming_each(brave, searxng, r) -> None:
    brave[1].fail_always(fault="server")
    searxng[1].fail_always(status=503)
    members = [guarded(BraveSearch(KEY, base_url=brave[0].url), r),
               guarded(SearxngSearch(searxng[0].url), r)]  # fmt: skip
    chain = SearchChain(members)
    deadline = time.monotonic() + 10
    while any(m.breaker.down() is None for m in members) and time.monotonic() < deadline:
        with pytest.raises(ChainFailed):
            chain.answer("celery", limit=3)
        time.sleep(0.05)
    with pytest.raises(ProviderDown) as caught:
        chain.search("celery", limit=3)
    assert str(caught.value).startswith("every search provider is down: search provider brave")
    assert "searxng" in str(caught.value) and caught.value.reason == "provider_down"


def test_a_transient_failure_among_the_errors_is_raised_for_a_retry(brave, tavily) -> None:
    brave[1].fail_next(fault="auth")
    tavily[1].fail_next(fault="rate")
    chain = SearchChain([BraveSearch(KEY, base_url=brave[0].url),
                         TavilySearch(KEY, base_url=tavily[0].url)])  # fmt: skip
    with pytest.raises(RateLimited) as caught:
        chain.search("celery", limit=3)
    assert caught.value.retry_after == 2.0


def test_refusals_only_are_one_provider_error_naming_each(brave, tavily) -> None:
    brave[1].fail_next(fault="auth")
    tavily[1].fail_next(fault="spent")
    chain = SearchChain([BraveSearch(KEY, base_url=brave[0].url),
                         TavilySearch(KEY, base_url=tavily[0].url)])  # fmt: skip
    with pytest.raises(ProviderError) as caught:
        chain.search("celery", limit=3)
    text = str(caught.value)
    assert text.startswith("brave,tavily: every search provider failed: brave: the API key")
    assert "tavily: the key's credits" in text


def test_a_lone_provider_raises_its_own_error(brave) -> None:
    brave[1].fail_next(fault="rate")
    with pytest.raises(ChainFailed) as caught:
        answer_query(BraveSearch(KEY, base_url=brave[0].url), "celery", limit=3)
    assert isinstance(caught.value.error, RateLimited)
    chain = SearchChain([BraveSearch(KEY, base_url=brave[0].url)])
    brave[1].fail_next(fault="rate")
    with pytest.raises(RateLimited):
        chain.search("celery", limit=3)


def _settings(**env: str) -> Settings:
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.endswith("_API_KEY")}
    try:
        os.environ.update(env)
        return Settings()
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(saved)


def test_the_configured_chain_is_built_in_order_behind_one_breaker_each(brave, searxng) -> None:
    settings = _settings(WEBCTX_SEARCH_PROVIDER="brave, searxng", BRAVE_API_KEY=KEY,
                         WEBCTX_BRAVE__BASE_URL=brave[0].url,
                         WEBCTX_SEARXNG_URL=searxng[0].url)  # fmt: skip
    endpoints: list[Endpoint] = []

    def guard(search, endpoint):  # type: ignore[no-untyped-def]
        endpoints.append(endpoint)
        return search

    chain = build_search(settings, guard)
    assert isinstance(chain, SearchChain) and chain.name == "brave,searxng"
    assert [e.provider for e in endpoints] == ["brave", "searxng"]
    assert endpoints[0].url == brave[0].url and endpoints[0].setting == "WEBCTX_BRAVE__BASE_URL"
    assert chain.answer("celery", limit=2).provider == "brave"


def test_a_keyed_provider_without_its_key_is_a_config_error() -> None:
    settings = _settings(WEBCTX_SEARCH_PROVIDER="exa")
    with pytest.raises(
        ConfigError, match="needs an API key: set EXA_API_KEY or WEBCTX_EXA__API_KEY"
    ):
        build_search(settings)


def test_the_vendor_default_endpoint_is_keyed_when_no_base_url() -> None:
    endpoint = search_endpoint(_settings(), "tavily")
    assert endpoint.url == "https://api.tavily.com"


@pytest.mark.parametrize(
    ("value", "message"),
    [("bing", "unknown search provider 'bing'"), ("brave,brave", "named twice"),
     (" , ", "at least one")],
)  # fmt: skip
def test_a_bad_chain_is_refused_naming_why(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _settings(WEBCTX_SEARCH_PROVIDER=value)
