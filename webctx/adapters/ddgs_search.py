"""SearchProvider on the `ddgs` metasearch package: the default, keyless provider."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import ddgs as ddgs_package
from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException

from webctx.errors import ProviderError, ProviderUnavailable, RateLimited
from webctx.models import SearchResult
from webctx.stages.search import time_range

if TYPE_CHECKING:
    # `ddgs.DDGS` is a lazy proxy class (it defers importing every engine); this is the real one.
    from ddgs.ddgs import DDGS

# DDGS raises this exact message when every engine answered but none had a hit.
_NO_RESULTS = "No results found."


class DdgsSearch:
    """Text search through `ddgs.DDGS`, results mapped onto SearchResult."""

    name = "ddgs"

    def __init__(
        self,
        *,
        ddgs: DDGS | None = None,
        region: str = "us-en",
        safesearch: Literal["on", "moderate", "off"] = "moderate",
        backend: str = "auto",
        timeout_s: float = 10.0,
    ) -> None:
        self._ddgs = ddgs if ddgs is not None else ddgs_package.DDGS(timeout=math.ceil(timeout_s))
        self.region, self.safesearch, self.backend = region, safesearch, backend

    def search(
        self, query: str, *, limit: int, recency_days: int | None = None
    ) -> list[SearchResult]:
        """Up to `limit` results, best first; no hits is an empty list, not an error."""
        # ddgs takes d/w/m/y for the day/week/month/year time ranges.
        timelimit = time_range(recency_days)[0] if recency_days else None
        try:
            rows = self._ddgs.text(
                query,
                region=self.region,
                safesearch=self.safesearch,
                timelimit=timelimit,
                max_results=limit,
                backend=self.backend,
            )
        except RatelimitException as exc:
            raise RateLimited(f"{self.name}: {exc}") from exc
        except TimeoutException as exc:
            raise ProviderUnavailable(f"{self.name}: timeout: {exc}", kind="timeout") from exc
        except DDGSException as exc:
            if str(exc) == _NO_RESULTS:
                return []
            # Engines' own 429/202 answers surface only as text in the aggregate error.
            if "ratelimit" in str(exc).lower():
                raise RateLimited(f"{self.name}: {exc}") from exc
            raise ProviderError(self.name, str(exc)) from exc
        return _to_results(rows, query=query, limit=limit)


def _to_results(rows: object, *, query: str, limit: int) -> list[SearchResult]:
    """Map ddgs rows (`href`, `title`, `body`) onto SearchResult, skipping non-http ones."""
    if not isinstance(rows, list):
        raise ProviderError(DdgsSearch.name, "unexpected result type")
    results: list[SearchResult] = []
    for row in rows:
        url = row.get("href") if isinstance(row, dict) else None
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            continue
        results.append(
            SearchResult(
                url=url,
                title=str(row.get("title") or ""),
                snippet=str(row.get("body") or ""),
                rank=len(results),
                query=query,
                provider=DdgsSearch.name,
            )
        )
    return results[:limit]
