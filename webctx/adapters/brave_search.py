"""SearchProvider on the Brave Search API (`GET /res/v1/web/search`, X-Subscription-Token)."""

from __future__ import annotations

import httpx

from webctx.adapters.keyed_search import (
    Json,
    KeyedApi,
    error_detail,
    http_url,
    key_refused,
    plain_text,
    rate_limited,
)
from webctx.errors import ProviderError
from webctx.models import SearchResult
from webctx.stages.search import time_range

PAGE_SIZE = 20
"""`count`'s most: Brave refuses more with a 422."""
MAX_OFFSET = 9
"""`offset` counts pages of `count` skipped, 0-9."""
_FRESHNESS = {"day": "pd", "week": "pw", "month": "pm", "year": "py"}
_KEY_CODES = ("SUBSCRIPTION_TOKEN_INVALID", "VALIDATION")


class BraveSearch:
    """Brave's web results, paged by `offset` until `limit`."""

    name = "brave"

    def __init__(
        self, api_key: str, *, base_url: str | None = None, client: httpx.Client | None = None,
        timeout_s: float = 10.0,
    ) -> None:  # fmt: skip
        headers = {"X-Subscription-Token": api_key, "Accept-Encoding": "gzip"}
        self._api = KeyedApi(self.name, base_url=base_url, headers=headers, refusal=_refusal,
                             client=client, timeout_s=timeout_s)  # fmt: skip
        self.base_url = self._api.base_url

    def search(
        self, query: str, *, limit: int, recency_days: int | None = None
    ) -> list[SearchResult]:
        """Up to `limit` results, best first (20 a request, at most 10 requests)."""
        count = max(1, min(PAGE_SIZE, limit))
        params = {"q": query, "count": str(count)}
        if recency_days:
            params["freshness"] = _FRESHNESS[time_range(recency_days)]
        results: list[SearchResult] = []
        seen: set[str] = set()
        for offset in range(MAX_OFFSET + 1):
            answer = self._api.request("GET", "/res/v1/web/search",
                                       params={**params, "offset": str(offset)})  # fmt: skip
            items = _items(answer)
            for item in items:
                url = http_url(item.get("url"))
                if url is None or url in seen:
                    continue
                seen.add(url)
                results.append(SearchResult(url=url, title=plain_text(item.get("title")),
                                            snippet=plain_text(item.get("description")),
                                            rank=len(results), query=query,
                                            provider=self.name))  # fmt: skip
            more = (answer.get("query") or {}).get("more_results_available", True)
            if len(results) >= limit or len(items) < count or more is False:
                break
        return results[:limit]

    def close(self) -> None:
        """Close the HTTP client if this adapter created it."""
        self._api.close()


def _items(answer: Json) -> list[Json]:
    web = answer.get("web")
    if web is None:  # no web results at all: Brave leaves the section out
        if answer.get("type") != "search":
            raise ProviderError(BraveSearch.name, "response is no search answer")
        return []
    results = web.get("results") if isinstance(web, dict) else None
    if not isinstance(results, list):
        raise ProviderError(BraveSearch.name, "response has no web.results list")
    return [item for item in results if isinstance(item, dict)]


def _refusal(status: int, body: Json, resp: httpx.Response) -> Exception | None:
    raw = body.get("error")
    error: Json = raw if isinstance(raw, dict) else {}
    code = str(error.get("code") or "")
    if status in (401, 403) or (status == 422 and code in _KEY_CODES and _about_key(error)):
        return key_refused(BraveSearch.name, status, code or error_detail(body) or resp.text)
    if status == 429:
        return rate_limited(BraveSearch.name, resp, retry_after=_reset_s(resp, error))
    return None


def _about_key(error: Json) -> bool:
    """A 422 about the subscription token (not one about our own parameters)."""
    if error.get("code") == "SUBSCRIPTION_TOKEN_INVALID":
        return True
    errors = (error.get("meta") or {}).get("errors") or []
    return any("x-subscription-token" in [str(p).lower() for p in e.get("loc", [])]
               for e in errors if isinstance(e, dict))  # fmt: skip


def _reset_s(resp: httpx.Response, error: Json) -> float | None:
    """The wait a 429 asks for: the per-second window's reset, or the monthly one's when the
    quota is spent (`X-RateLimit-Reset: 1, 1419704`: seconds until each window resets)."""
    resets = [p.strip() for p in resp.headers.get("x-ratelimit-reset", "").split(",")]
    meta = error.get("meta") or {}
    quota_spent = meta.get("quota_limit") is not None and (
        meta.get("quota_current") == meta.get("quota_limit"))  # fmt: skip
    pick = resets[-1] if quota_spent else resets[0]
    try:
        return max(0.0, float(pick))
    except ValueError:
        return None
