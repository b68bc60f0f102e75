"""The seams of the pipeline. Each has a real adapter and an in-memory one.

Adapters translate their library's errors into `webctx.errors`; stages never
see httpx, openai or qdrant_client exceptions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from webctx.errors import FetchError
from webctx.models import Download, PdfText, ScoredChunk, SearchResult, StoredChunk

VectorDatatype = Literal["float32", "float16"]
"""How a store keeps dense vectors (WEBCTX_QDRANT_VECTOR_DATATYPE)."""


@runtime_checkable
class SearchProvider(Protocol):
    """A web search engine."""

    name: str

    def search(
        self, query: str, *, limit: int, recency_days: int | None = None
    ) -> list[SearchResult]:
        """Results for one query, best first, published within `recency_days` when given
        (at the provider's granularity: day, week, month, year). Raises RateLimited,
        ProviderUnavailable, ProviderError."""
        ...


@runtime_checkable
class Fetcher(Protocol):
    """Downloads one URL under the fetch policy (timeouts, caps, safe addresses)."""

    def fetch(self, url: str) -> Download:
        """The body of `url` after redirects. Raises FetchError subclasses."""
        ...


class Renderer(Protocol):
    """Loads a page in a browser whose every request passes the fetch guard."""

    def render(self, url: str) -> Download:
        """The rendered DOM of `url` as an HTML Download. Raises FetchError subclasses."""
        ...


class PdfReader(Protocol):
    """Reads a PDF's page texts and metadata (in a sandbox: the input is hostile)."""

    def read(self, body: bytes, *, url: str) -> PdfText:
        """The PDF's pages and metadata. Raises UnreadablePdf, its reason saying why."""
        ...


@dataclass(frozen=True)
class Embeddings:
    """One embedder call's answer: a vector per text, and what the provider said of its
    rate limits (`x-ratelimit-*` headers, lower-cased; empty when it says nothing)."""

    vectors: list[list[float]]
    rate_limits: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors."""

    model: str

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """One vector per text, same order, in one provider request, with the provider's
        rate-limit headers of that answer. Raises RateLimited (with the 429's headers),
        ProviderUnavailable, ProviderError."""
        ...


@runtime_checkable
class EmbeddingCache(Protocol):
    """Vectors by text, shared by every job and the index (`webctx.jobs.embed_cache`).

    Texts equal after `webctx.stages.embed.cache_text` (whitespace runs collapsed) share one
    entry per model and dimensions; an entry may vanish at any time (a miss costs one
    embedding, never a result)."""

    def get_many(
        self, model: str, dimensions: int | None, texts: Sequence[str]
    ) -> list[list[float] | None]:
        """The cached vector of each text, or None, same order."""
        ...

    def set_many(
        self,
        model: str,
        dimensions: int | None,
        texts: Sequence[str],
        vectors: Sequence[Sequence[float]],
    ) -> None:
        """Remember each text's vector."""
        ...


# -- the vector store, one protocol per role -------------------------------------------------
# Every backend (memory_store, edge_store, qdrant_store) plays every role; each caller types
# its store by the role it uses. Contract tests run each role on every backend
# (tests/unit/test_vector_store.py, tests/unit/test_index_store.py).


@runtime_checkable
class VectorStore(Protocol):
    """What a research job's store and rank steps use: content-addressed points (chunk
    vectors with their payload), upserted idempotently by id and searched among the job's
    own pages."""

    def upsert(self, points: Sequence[StoredChunk]) -> None:
        """Insert or overwrite points by id."""
        ...

    def search(
        self,
        vector: Sequence[float],
        *,
        limit: int,
        content_sha256s: Sequence[str],
        with_vectors: bool = True,
    ) -> list[ScoredChunk]:
        """Nearest chunks by cosine similarity among the given pages; with their vectors
        unless `with_vectors` is False (then each hit's vector is empty)."""
        ...

    def vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        """The stored vectors of the points among `ids` that exist."""
        ...

    def count(self) -> int:
        """Number of points held (0: a store opened empty)."""
        ...


@dataclass(frozen=True)
class IndexScope:
    """The points an index search may return: one tenant's live pages at one generation.

    A point is live for the tenant at generation g when its `from` mark is <= g and it has
    no `until` mark <= g (`webctx.index.generations`). `site` narrows to one site (lower case),
    `content_sha256s` to some pages (None: every live page)."""

    tenant_key: str
    generation: int
    site: str | None = None
    content_sha256s: Sequence[str] | None = None

    @property
    def selects_nothing(self) -> bool:
        """True when the scope is narrowed to no page at all."""
        return self.content_sha256s is not None and not self.content_sha256s


@runtime_checkable
class IndexWriter(Protocol):
    """What a re-index run writes beside the points it upserts: their BM25 sparse points,
    the tenants' live marks, and the deletion of pages nothing points at any more.

    Marking touches payload only (no vectors), so a swap costs a few updates, and a
    tenant-wide search is one payload condition instead of a list of every page."""

    def upsert_sparse(self, points: Sequence[StoredChunk]) -> None:
        """Index the points' chunk texts as sparse BM25 vectors under the same ids."""
        ...

    def mark_pages(
        self, *, tenant_key: str, generation: int, live: Mapping[str, str], dead: Sequence[str]
    ) -> None:
        """Make `live` pages (hash -> site) visible from `generation`, `dead` ones not."""
        ...

    def delete_pages(self, content_sha256s: Sequence[str]) -> None:
        """Delete every point (dense and sparse) of the given pages."""
        ...


@runtime_checkable
class IndexReader(Protocol):
    """What an index search reads: point ids ranked within a tenant's live pages (no
    payload: fusion needs ranks only), then the few points it returns."""

    def rank_live(self, vector: Sequence[float], *, limit: int, scope: IndexScope) -> list[str]:
        """Point ids of the nearest chunks by cosine among the scope's pages, best first."""
        ...

    def rank_live_sparse(self, text: str, *, limit: int, scope: IndexScope) -> list[str]:
        """Point ids of the best BM25 matches among the scope's pages, best first."""
        ...

    def retrieve(self, ids: Sequence[str]) -> dict[str, StoredChunk]:
        """The points of these ids (dense or sparse), without vectors; absent ids are left
        out (deleted since they were ranked)."""
        ...


@runtime_checkable
class IndexStore(VectorStore, IndexWriter, IndexReader, Protocol):
    """Every role the persistent index uses: a re-index run writes pages' points, sparse
    points and marks; a search reads them."""


@runtime_checkable
class GroupFlushable(Protocol):
    """A store whose writes become durable at its flush (qdrant-edge), so that one flush
    can make many writes durable; a store without it makes each write durable itself."""

    def upsert_unflushed(self, points: Sequence[StoredChunk]) -> None:
        """`upsert`, searchable on return but durable only after the next `flush`."""
        ...

    def flush(self) -> None:
        """Make every write so far durable."""
        ...


@runtime_checkable
class Optimizable(Protocol):
    """A store whose engine builds its search graphs only when asked (qdrant-edge)."""

    def unindexed(self) -> int:
        """Dense points not yet in a search graph (searched by brute force)."""
        ...

    def optimize(self) -> bool:
        """Build the graphs the engine leaves to the caller; True if anything was built.
        Blocks, and may take minutes on a large unindexed store."""
        ...


@runtime_checkable
class ConditionalFetcher(Protocol):
    """A Fetcher that revalidates: a 304 comes back as a Download with status 304, no body."""

    def fetch(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        media_types: frozenset[str] | None = None,
    ) -> Download:
        """The body of `url`, or a 304 Download when the validators still match."""
        ...


@dataclass(frozen=True)
class Revalidation:
    """One conditional GET of a batch: a URL and the validators of its last fetch."""

    url: str
    etag: str | None = None
    last_modified: str | None = None


@runtime_checkable
class BatchFetcher(ConditionalFetcher, Protocol):
    """A ConditionalFetcher that runs many revalidations itself (one event loop, kept-alive
    connections), instead of one calling thread per request."""

    def fetch_many(
        self, requests: Sequence[Revalidation], *, window: int
    ) -> Iterator[tuple[int, Download | FetchError]]:
        """(index in `requests`, Download or the FetchError) as each completes. At most
        `window` requests are in flight or waiting to be taken; stopping early cancels
        the rest."""
        ...
