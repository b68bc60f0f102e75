"""The configured search: one adapter per provider of WEBCTX_SEARCH_PROVIDER, each behind
its endpoint's shared breaker, in a chain (`webctx.stages.search_chain`)."""

from __future__ import annotations

from collections.abc import Callable

from webctx.errors import ConfigError
from webctx.net.breaker import Endpoint
from webctx.protocols import SearchProvider
from webctx.search_settings import DEFAULT_BASE_URLS, VENDOR_KEY_ENV, chain_names
from webctx.settings import Settings
from webctx.stages.search_chain import SearchChain

Guard = Callable[[SearchProvider, Endpoint], SearchProvider]


def build_provider(settings: Settings, name: str) -> SearchProvider:
    """The adapter of one provider; ConfigError when its key or URL is missing."""
    if name == "searxng":
        if not settings.searxng_url:
            raise ConfigError("WEBCTX_SEARCH_PROVIDER=searxng needs WEBCTX_SEARXNG_URL")
        from webctx.adapters.searxng_search import SearxngSearch

        return SearxngSearch(settings.searxng_url, timeout_s=settings.fetch.read_timeout_s)
    if name == "ddgs":
        from webctx.adapters.ddgs_search import DdgsSearch

        return DdgsSearch()
    return _keyed(settings, name)


def _keyed(settings: Settings, name: str) -> SearchProvider:
    group = getattr(settings, name)
    if group.api_key is None or not group.api_key.get_secret_value():
        raise ConfigError(f"WEBCTX_SEARCH_PROVIDER names {name}, which needs an API key: set "
                          f"{VENDOR_KEY_ENV[name]} or WEBCTX_{name.upper()}__API_KEY")  # fmt: skip
    key, common = group.api_key.get_secret_value(), {"base_url": group.base_url,
                                                     "timeout_s": group.timeout_s}  # fmt: skip
    if name == "brave":
        from webctx.adapters.brave_search import BraveSearch

        return BraveSearch(key, **common)
    if name == "tavily":
        from webctx.adapters.tavily_search import TavilySearch

        return TavilySearch(key, include_raw_content=group.include_raw_content, **common)
    if name == "exa":
        from webctx.adapters.exa_search import ExaSearch

        return ExaSearch(key, text_max_chars=group.text_max_chars, **common)
    from webctx.adapters.serper_search import SerperSearch

    return SerperSearch(key, **common)


def search_endpoint(settings: Settings, name: str) -> Endpoint:
    """What the breaker keys a provider by, and what its outage message names."""
    if name == "searxng":
        setting = "WEBCTX_SEARXNG_URL"
        limits = f"the instance limits this client: raise its limiter's limits ({setting})"
        return Endpoint("search", name, settings.searxng_url or "", setting, limits)
    if name == "ddgs":
        limits = "DuckDuckGo limits this address: wait, or use SearxNG (WEBCTX_SEARCH_PROVIDER)"
        return Endpoint("search", name, "", "WEBCTX_SEARCH_PROVIDER", limits)
    url = getattr(settings, name).base_url or DEFAULT_BASE_URLS[name]
    limits = (f"check the key's plan and rate limits ({VENDOR_KEY_ENV[name]}), or add another "
              "provider after it to WEBCTX_SEARCH_PROVIDER")  # fmt: skip
    return Endpoint("search", name, url, f"WEBCTX_{name.upper()}__BASE_URL", limits)


def build_search(settings: Settings, guard: Guard | None = None) -> SearchProvider:
    """The configured providers, each through `guard` (its breaker), as a chain."""
    members = []
    for name in chain_names(settings.search_provider):
        provider = build_provider(settings, name)
        members.append(guard(provider, search_endpoint(settings, name)) if guard else provider)
    return SearchChain(members)
