"""A chain of search providers (`WEBCTX_SEARCH_PROVIDER=brave,searxng`): each query goes to
the first, and on to the next when one fails (an error, a 429, no answer).

A member behind a breaker (`webctx.net.breaker.GuardedSearch`) that is known to be down is
skipped without a request. When every member failed, the chain raises: a one-member chain
its member's error as it is; else ProviderDown when every member is down (the job fails
`provider_down`), the first transient error when one was transient (the query is retried,
from the first member), and otherwise one ProviderError naming each member's error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from webctx.errors import ProviderDown, ProviderError, TransientError, WebctxError
from webctx.models import SearchResult
from webctx.net.breaker import GuardedSearch
from webctx.protocols import SearchProvider

logger = logging.getLogger(__name__)

Outcome = Literal["answered", "failed", "skipped"]


@dataclass(frozen=True)
class Attempt:
    """One member's part in one query: answered, failed (a request went), or skipped (its
    breaker is open: no request)."""

    provider: str
    outcome: Outcome
    error: str = ""


@dataclass(frozen=True)
class ChainAnswer:
    """One query's results, who gave them (`provider`) and every member's attempt."""

    results: list[SearchResult]
    provider: str
    attempts: list[Attempt] = field(default_factory=list)


class SearchChain:
    """SearchProviders tried in order; itself a SearchProvider named `brave,searxng`."""

    def __init__(self, members: Sequence[SearchProvider]) -> None:
        if not members:
            raise ValueError("a search chain needs a provider")
        self.members = list(members)
        self.name = ",".join(m.name for m in self.members)

    def search(
        self, query: str, *, limit: int, recency_days: int | None = None
    ) -> list[SearchResult]:
        """The first member's results that answers; raises the chain's error when none does."""
        try:
            return self.answer(query, limit=limit, recency_days=recency_days).results
        except ChainFailed as failed:
            raise failed.error from failed

    def answer(self, query: str, *, limit: int, recency_days: int | None = None) -> ChainAnswer:
        """The first answer of the members, in order, with each member's attempt; ChainFailed
        when none answered."""
        attempts: list[Attempt] = []
        errors: list[WebctxError] = []
        for member in self.members:
            down = member.breaker.down() if isinstance(member, GuardedSearch) else None
            if down is not None:
                attempts.append(Attempt(member.name, "skipped", str(down)))
                errors.append(down)
                continue
            try:
                results = member.search(query, limit=limit, recency_days=recency_days)
            except WebctxError as exc:
                attempts.append(Attempt(member.name, "failed", str(exc)))
                errors.append(exc)
                logger.info("search provider failed", extra={"provider": member.name,
                            "query": query, "error": str(exc)})  # fmt: skip
                continue
            attempts.append(Attempt(member.name, "answered"))
            return ChainAnswer(results, member.name, attempts)
        raise ChainFailed(self._failure(errors), attempts)

    def _failure(self, errors: list[WebctxError]) -> WebctxError:
        if len(errors) == 1:
            return errors[0]
        if all(isinstance(e, ProviderDown) for e in errors):
            first = errors[0]
            url = first.url if isinstance(first, ProviderDown) else ""
            return ProviderDown(self.name, "every search provider is down: "
                                + "; ".join(map(str, errors)), url=url)  # fmt: skip
        transient = next((e for e in errors if isinstance(e, TransientError)), None)
        if transient is not None:
            return transient
        return ProviderError(self.name, "every search provider failed: "
                             + "; ".join(map(str, errors)))  # fmt: skip


class ChainFailed(Exception):
    """Every member failed: `error` is what the chain raises, `attempts` what each did."""

    def __init__(self, error: WebctxError, attempts: list[Attempt]) -> None:
        super().__init__(str(error))
        self.error, self.attempts = error, attempts


def answer_query(
    provider: SearchProvider, query: str, *, limit: int, recency_days: int | None = None
) -> ChainAnswer:
    """One query's answer from a chain (each member's attempt) or from a lone provider.
    Raises ChainFailed (its `error` the chain's) when no member answered."""
    if isinstance(provider, SearchChain):
        return provider.answer(query, limit=limit, recency_days=recency_days)
    try:
        results = provider.search(query, limit=limit, recency_days=recency_days)
    except WebctxError as exc:
        raise ChainFailed(exc, [Attempt(provider.name, "failed", str(exc))]) from exc
    return ChainAnswer(results, provider.name, [Attempt(provider.name, "answered")])


def tagged_answer(answer: ChainAnswer, query: str, *, limit: int) -> list[SearchResult]:
    """Up to `limit` http(s) results of an answer, tagged with the query and provider."""
    tagged = [
        r.model_copy(update={"query": r.query or query, "provider": r.provider or answer.provider})
        for r in answer.results
        if r.url.lower().startswith(("http://", "https://"))
    ]
    logger.info("search done", extra={"provider": answer.provider, "query": query,
                                      "results": len(tagged)})  # fmt: skip
    return tagged[:limit]
