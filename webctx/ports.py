"""The seams of the pipeline. Each has a real adapter and an in-memory one.

Adapters translate their library's errors into `webctx.errors`; stages never
see httpx, openai or qdrant_client exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from webctx.models import Download, ScoredChunk, SearchResult, StoredChunk


@runtime_checkable
class SearchProvider(Protocol):
    """A web search engine."""

    name: str

    def search(self, query: str, *, limit: int) -> list[SearchResult]:
        """Results for one query, best first. Raises RateLimited, ProviderUnavailable,
        ProviderError."""
        ...


@runtime_checkable
class Fetcher(Protocol):
    """Downloads one URL under the fetch policy (timeouts, caps, safe addresses)."""

    def fetch(self, url: str) -> Download:
        """The body of `url` after redirects. Raises FetchError subclasses."""
        ...


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors."""

    model: str

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, same order, in one provider request.
        Raises RateLimited, ProviderUnavailable, ProviderError."""
        ...


@runtime_checkable
class VectorStore(Protocol):
    """Holds chunk vectors with their payload; upserts are idempotent by point id."""

    def upsert(self, points: Sequence[StoredChunk]) -> None:
        """Insert or overwrite points by id."""
        ...

    def search(
        self, vector: Sequence[float], *, limit: int, content_sha256s: Sequence[str]
    ) -> list[ScoredChunk]:
        """Nearest chunks by cosine similarity among the given pages, with vectors."""
        ...

    def count(self) -> int:
        """Number of points held."""
        ...
