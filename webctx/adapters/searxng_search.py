"""SearchProvider on a SearxNG instance's JSON API (`search.formats` must include json)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime

import httpx

from webctx.errors import ProviderError, ProviderUnavailable, RateLimited
from webctx.models import SearchResult
from webctx.stages.search import time_range


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a `retry-after` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


PAGE_SIZE_GUESS = 10
"""Results per page assumed until an instance has answered a first page (SearxNG's
engines mostly give 10 each; the page merges them)."""


class SearxngSearch:
    """Queries `GET {base_url}/search?format=json`, paging until `limit` results.

    The pages a query needs (`limit` over the instance's page size, as seen on its first
    pages; 10 until then) are asked for at once, not one after another: each page costs
    the instance's whole search time (its engines are asked again), 0.5-2 s on a public
    instance. Pages beyond those, if some results repeat, follow one at a time."""

    name = "searxng"

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.Client | None = None,
        timeout_s: float = 10.0,
        max_pages: int = 3,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_pages = max_pages
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=timeout_s, follow_redirects=True)
        self._timeout_s = timeout_s
        self._page_size = 0  # the most results one page has held; 0: none seen yet

    def search(
        self, query: str, *, limit: int, recency_days: int | None = None
    ) -> list[SearchResult]:
        """Up to `limit` results, best first; SearxNG's page size is fixed, so page on."""
        results: list[SearchResult] = []
        seen: set[str] = set()
        extra = {"time_range": time_range(recency_days)} if recency_days else {}
        size = self._page_size or PAGE_SIZE_GUESS
        at_once = max(1, min(self.max_pages, -(-limit // size)))
        pages = self._pages(query, range(1, at_once + 1), extra)
        for pageno in range(1, self.max_pages + 1):
            items = pages[pageno - 1] if pageno <= at_once else self._page(query, pageno, extra)
            self._page_size = max(self._page_size, len(items))
            fresh = [item for item in items if item["url"] not in seen]
            for item in fresh:
                seen.add(item["url"])
                results.append(_to_result(item, rank=len(results), query=query))
            if len(results) >= limit or not fresh:
                break
        return results[:limit]

    def _pages(
        self, query: str, pagenos: range, extra: dict[str, str]
    ) -> list[list[dict[str, str]]]:
        """The pages `pagenos`, asked for at once; the first page's error first."""
        if len(pagenos) == 1:
            return [self._page(query, pagenos[0], extra)]
        with ThreadPoolExecutor(len(pagenos), thread_name_prefix="searxng-page") as pool:
            return list(pool.map(lambda n: self._page(query, n, extra), pagenos))

    def close(self) -> None:
        """Close the HTTP client if this adapter created it."""
        if self._owns_client:
            self._client.close()

    def _page(self, query: str, pageno: int, extra: dict[str, str]) -> list[dict[str, str]]:
        """The usable results of one page; raises the webctx error tree."""
        params = {"q": query, "format": "json", "pageno": str(pageno), **extra}
        try:
            resp = self._client.get(
                f"{self.base_url}/search", params=params, timeout=self._timeout_s
            )
        except httpx.UnsupportedProtocol as exc:
            raise ProviderError(self.name, f"bad base URL: {exc}") from exc
        except httpx.TransportError as exc:  # connect, read, timeouts, protocol errors
            raise _unavailable(self.name, exc) from exc
        _raise_for_status(self.name, resp)
        try:
            body = resp.json()
        except ValueError as exc:
            raise ProviderError(self.name, "response is not JSON") from exc
        if not isinstance(body, dict) or not isinstance(body.get("results"), list):
            raise ProviderError(self.name, "response has no results list")
        return [item for raw in body["results"] if (item := _item(raw)) is not None]


def _raise_for_status(provider: str, resp: httpx.Response) -> None:
    """Map a non-2xx answer onto RateLimited, ProviderUnavailable or ProviderError."""
    status = resp.status_code
    if status < 300:
        return
    if status == 429:
        raise RateLimited(
            f"{provider}: 429", retry_after=parse_retry_after(resp.headers.get("retry-after"))
        )
    if status >= 500:
        raise ProviderUnavailable(f"{provider}: HTTP {status}", kind="status",
                                  detail=f"HTTP {status}")  # fmt: skip
    hint = " (is json in the instance's search.formats?)" if status == 403 else ""
    raise ProviderError(provider, f"HTTP {status}{hint}")


def _unavailable(provider: str, exc: httpx.TransportError) -> ProviderUnavailable:
    """The ProviderUnavailable of a request that got no answer, with its kind."""
    if isinstance(exc, httpx.TimeoutException):
        kind = "timeout"
    elif isinstance(exc, httpx.ConnectError):
        kind = "unreachable"
    else:  # the connection broke mid-answer
        kind = "error"
    detail = str(exc) or type(exc).__name__
    return ProviderUnavailable(f"{provider}: {type(exc).__name__}: {exc}", kind=kind,
                               detail=detail)  # fmt: skip


def _item(raw: object) -> dict[str, str] | None:
    """A result's url/title/content as strings, or None when it has no http(s) URL."""
    if not isinstance(raw, dict):
        return None
    url = raw.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return None
    title, content = raw.get("title"), raw.get("content")
    return {
        "url": url,
        "title": title if isinstance(title, str) else "",
        "content": content if isinstance(content, str) else "",
    }


def _to_result(item: dict[str, str], *, rank: int, query: str) -> SearchResult:
    return SearchResult(
        url=item["url"],
        title=item["title"],
        snippet=item["content"],
        rank=rank,
        query=query,
        provider=SearxngSearch.name,
    )
