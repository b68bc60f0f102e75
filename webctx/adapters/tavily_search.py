"""SearchProvider on Tavily's search API (`POST /search`, `Authorization: Bearer tvly-…`)."""

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
    text_or_none,
)
from webctx.models import SearchResult
from webctx.stages.search import time_range

MAX_RESULTS = 20
"""`max_results`' most; Tavily has no paging."""


class TavilySearch:
    """Tavily's results, each with the page's text when `include_raw_content`."""

    name = "tavily"

    def __init__(
        self, api_key: str, *, base_url: str | None = None, client: httpx.Client | None = None,
        timeout_s: float = 10.0, include_raw_content: bool = True,
    ) -> None:  # fmt: skip
        headers = {"Authorization": f"Bearer {api_key}"}
        self._api = KeyedApi(self.name, base_url=base_url, headers=headers, refusal=_refusal,
                             client=client, timeout_s=timeout_s)  # fmt: skip
        self.base_url = self._api.base_url
        self.include_raw_content = include_raw_content

    def search(
        self, query: str, *, limit: int, recency_days: int | None = None
    ) -> list[SearchResult]:
        """Up to `limit` results (20 at most), best first."""
        raw = "text" if self.include_raw_content else False
        body: Json = {"query": query, "search_depth": "basic",
                      "max_results": max(1, min(MAX_RESULTS, limit)),
                      "include_raw_content": raw}  # fmt: skip
        if recency_days:
            body["time_range"] = time_range(recency_days)
        answer = self._api.request("POST", "/search", body=body)
        results: list[SearchResult] = []
        for url, item in listed(self.name, answer.get("results")):
            results.append(SearchResult(url=url, title=plain_text(item.get("title")),
                                        snippet=plain_text(item.get("content")),
                                        rank=len(results), query=query, provider=self.name,
                                        content=text_or_none(item.get("raw_content"))))  # fmt: skip
        return results[:limit]

    def close(self) -> None:
        """Close the HTTP client if this adapter created it."""
        self._api.close()


def _refusal(status: int, body: Json, resp: httpx.Response) -> Exception | None:
    detail = error_detail(body) or resp.text
    if status == 401:
        return key_refused(TavilySearch.name, status, detail)
    if status in (403, 432, 433):  # forbidden, plan limit, pay-as-you-go limit
        return spent(TavilySearch.name, status, detail)
    return None
