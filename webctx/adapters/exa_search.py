"""SearchProvider on Exa's search API (`POST /search`, `x-api-key`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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

MAX_RESULTS = 100
"""`numResults`' most (past 25 priced higher)."""
SNIPPET_CHARS = 300


class ExaSearch:
    """Exa's results, each with the page's text when `text_max_chars` > 0."""

    name = "exa"

    def __init__(
        self, api_key: str, *, base_url: str | None = None, client: httpx.Client | None = None,
        timeout_s: float = 10.0, text_max_chars: int = 10_000,
    ) -> None:  # fmt: skip
        self._api = KeyedApi(self.name, base_url=base_url, headers={"x-api-key": api_key},
                             refusal=_refusal, client=client, timeout_s=timeout_s)  # fmt: skip
        self.base_url = self._api.base_url
        self.text_max_chars = text_max_chars

    def search(
        self, query: str, *, limit: int, recency_days: int | None = None
    ) -> list[SearchResult]:
        """Up to `limit` results, best first; with `recency_days`, only pages dated within
        them (Exa drops the undated ones)."""
        body: Json = {"query": query, "type": "auto", "numResults": max(1, min(MAX_RESULTS, limit))}
        if self.text_max_chars > 0:
            body["contents"] = {"text": {"maxCharacters": self.text_max_chars}}
        if recency_days:
            since = datetime.now(UTC) - timedelta(days=recency_days)
            body["startPublishedDate"] = since.strftime("%Y-%m-%dT%H:%M:%S.000Z")
        answer = self._api.request("POST", "/search", body=body)
        results: list[SearchResult] = []
        for url, item in listed(self.name, answer.get("results")):
            text = text_or_none(item.get("text"))
            results.append(SearchResult(url=url, title=plain_text(item.get("title")),
                                        snippet=_snippet(item, text or ""), rank=len(results),
                                        query=query, provider=self.name,
                                        content=text))  # fmt: skip
        return results[:limit]

    def close(self) -> None:
        """Close the HTTP client if this adapter created it."""
        self._api.close()


def _snippet(item: Json, text: str) -> str:
    highlights = item.get("highlights")
    if isinstance(highlights, list) and highlights:
        return plain_text(" … ".join(h for h in highlights if isinstance(h, str)))
    summary = item.get("summary")
    return plain_text(summary) if isinstance(summary, str) and summary else plain_text(
        text[:SNIPPET_CHARS])  # fmt: skip


def _refusal(status: int, body: Json, resp: httpx.Response) -> Exception | None:
    detail = error_detail(body) or resp.text
    if status == 401:
        return key_refused(ExaSearch.name, status, detail)
    if status == 402:  # NO_MORE_CREDITS, API_KEY_BUDGET_EXCEEDED
        return spent(ExaSearch.name, status, str(body.get("tag") or detail))
    return None
