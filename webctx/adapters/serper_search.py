"""SearchProvider on Serper's Google SERP API (`POST /search`, `X-API-KEY`)."""

from __future__ import annotations

import httpx

from webctx.adapters.keyed_search import (
    Json,
    KeyedApi,
    error_detail,
    key_refused,
    listed,
    plain_text,
    spent,
)
from webctx.errors import ProviderError
from webctx.models import SearchResult
from webctx.stages.search import time_range

MAX_RESULTS = 100
"""`num`'s most."""
_TBS = {"day": "qdr:d", "week": "qdr:w", "month": "qdr:m", "year": "qdr:y"}


class SerperSearch:
    """Google's organic results through Serper, in one request."""

    name = "serper"

    def __init__(
        self, api_key: str, *, base_url: str | None = None, client: httpx.Client | None = None,
        timeout_s: float = 10.0,
    ) -> None:  # fmt: skip
        self._api = KeyedApi(self.name, base_url=base_url, headers={"X-API-KEY": api_key},
                             refusal=_refusal, client=client, timeout_s=timeout_s)  # fmt: skip
        self.base_url = self._api.base_url

    def search(
        self, query: str, *, limit: int, recency_days: int | None = None
    ) -> list[SearchResult]:
        """Up to `limit` results, best first."""
        body: Json = {"q": query, "num": max(1, min(MAX_RESULTS, limit))}
        if recency_days:
            body["tbs"] = _TBS[time_range(recency_days)]
        answer = self._api.request("POST", "/search", body=body)
        if "organic" not in answer and "searchParameters" not in answer:
            raise ProviderError(self.name, "response is no search answer")
        # No organic hits: the key may be missing.
        found = listed(self.name, answer.get("organic", []), url_field="link", name="organic")
        results: list[SearchResult] = []
        for url, item in found:
            results.append(SearchResult(url=url, title=plain_text(item.get("title")),
                                        snippet=plain_text(item.get("snippet")),
                                        rank=len(results), query=query,
                                        provider=self.name))  # fmt: skip
        return results[:limit]

    def close(self) -> None:
        """Close the HTTP client if this adapter created it."""
        self._api.close()


def _refusal(status: int, body: Json, resp: httpx.Response) -> Exception | None:
    detail = error_detail(body) or resp.text
    if status in (401, 403):
        return key_refused(SerperSearch.name, status, detail)
    if status == 400 and "credits" in detail.lower():
        return spent(SerperSearch.name, status, detail)
    return None
