"""A VectorStore on a Qdrant collection through qdrant-client (a server, or its local mode).

The collection is created at the first upsert, when the vector dimension becomes known,
with cosine distance and a keyword index on content_sha256 (the filter of every search).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc
import httpx
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from webctx.errors import ProviderError, ProviderUnavailable
from webctx.models import ScoredChunk, StoredChunk
from webctx.sparse import document_vector, query_vector
from webctx.stages.store import CONTENT_KEY, point_payload, scored_chunk

PROVIDER = "qdrant"
SPARSE = "bm25"
SPARSE_SUFFIX = "_sparse"
"""The index's BM25 vectors live in a sibling collection `<collection>_sparse`, so the dense
collection's schema (and every existing deployment of it) stays as it is."""
T = TypeVar("T")

_GRPC_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def _is_transient(exc: Exception) -> bool:
    """True for failures worth a retry: unreachable, timed out, 5xx, 429."""
    if isinstance(exc, ResponseHandlingException):
        return isinstance(exc.source, httpx.TransportError)
    if isinstance(exc, httpx.TransportError):
        return True
    if isinstance(exc, UnexpectedResponse):
        return exc.status_code is not None and (exc.status_code >= 500 or exc.status_code == 429)
    if isinstance(exc, grpc.RpcError):
        return exc.code() in _GRPC_TRANSIENT
    return False


def _client(call: Callable[[], T]) -> T:
    """Run one client call, translating its errors into the webctx tree."""
    try:
        return call()
    except Exception as exc:  # local mode raises ValueError/RuntimeError, servers ApiException
        if _is_transient(exc):
            raise ProviderUnavailable(f"{PROVIDER}: {exc}") from exc
        raise ProviderError(PROVIDER, str(exc)) from exc


def _dense(vector: object) -> list[float]:
    """The default dense vector of a returned point."""
    if not isinstance(vector, list):
        raise ProviderError(PROVIDER, f"unexpected vector type {type(vector).__name__}")
    return [float(x) for x in vector]


class QdrantVectorStore:
    """Points in one Qdrant collection, cosine distance, content_sha256 indexed."""

    def __init__(self, client: QdrantClient, *, collection: str) -> None:
        self.client = client
        self.collection = collection
        self._ready = False  # the collection is known to exist
        self._sparse_ready = False
        self._guard = threading.Lock()

    def upsert(self, points: Sequence[StoredChunk]) -> None:
        """Insert or overwrite points by id; the first upsert creates the collection."""
        if not points:
            return
        self._ensure_collection(len(points[0].vector))
        structs = [
            models.PointStruct(id=p.id, vector=list(p.vector), payload=point_payload(p))
            for p in points
        ]
        # wait=True: the next task (rank) must see these points.
        _client(lambda: self.client.upsert(self.collection, points=structs, wait=True))

    def search(
        self, vector: Sequence[float], *, limit: int, content_sha256s: Sequence[str]
    ) -> list[ScoredChunk]:
        """Nearest chunks by cosine similarity among the given pages, with vectors."""
        if not content_sha256s or limit < 1 or not self._exists():
            return []
        pages = models.FieldCondition(
            key=CONTENT_KEY, match=models.MatchAny(any=list(content_sha256s))
        )
        response = _client(
            lambda: self.client.query_points(
                self.collection,
                query=[float(x) for x in vector],
                query_filter=models.Filter(must=[pages]),
                limit=limit,
                with_payload=True,
                with_vectors=True,
            )
        )
        return [
            scored_chunk(hit.payload or {}, score=hit.score, vector=_dense(hit.vector))
            for hit in response.points
        ]

    def count(self) -> int:
        """Number of points held."""
        if not self._exists():
            return 0
        return _client(lambda: self.client.count(self.collection, exact=True)).count

    def delete_pages(self, content_sha256s: Sequence[str]) -> None:
        """Delete every point (dense and sparse) of the given pages."""
        if not content_sha256s:
            return
        pages = models.FieldCondition(
            key=CONTENT_KEY, match=models.MatchAny(any=list(content_sha256s))
        )
        selector = models.FilterSelector(filter=models.Filter(must=[pages]))
        for name, present in ((self.collection, self._exists()),
                              (self._sparse_name, self._sparse_exists())):  # fmt: skip
            if present:
                _client(
                    functools.partial(self.client.delete, name, points_selector=selector, wait=True)
                )

    def upsert_sparse(self, points: Sequence[StoredChunk]) -> None:
        """Index the points' chunk texts as BM25 sparse vectors, under the same ids."""
        if not points:
            return
        self._ensure_sparse()
        structs = []
        for p in points:
            sv = document_vector(p.chunk.text)
            vector: models.VectorStruct = {
                SPARSE: models.SparseVector(indices=sv.indices, values=sv.values)
            }
            structs.append(models.PointStruct(id=p.id, vector=vector, payload=point_payload(p)))
        _client(lambda: self.client.upsert(self._sparse_name, points=structs, wait=True))

    def search_sparse(
        self, text: str, *, limit: int, content_sha256s: Sequence[str]
    ) -> list[ScoredChunk]:
        """Best BM25 matches of `text` among the given pages (no vectors)."""
        sv = query_vector(text)
        if not content_sha256s or limit < 1 or not sv.indices or not self._sparse_exists():
            return []
        pages = models.FieldCondition(
            key=CONTENT_KEY, match=models.MatchAny(any=list(content_sha256s))
        )
        response = _client(
            lambda: self.client.query_points(
                self._sparse_name,
                query=models.SparseVector(indices=sv.indices, values=sv.values),
                using=SPARSE,
                query_filter=models.Filter(must=[pages]),
                limit=limit,
                with_payload=True,
            )
        )
        return [
            scored_chunk(hit.payload or {}, score=hit.score, vector=[]) for hit in response.points
        ]

    @property
    def _sparse_name(self) -> str:
        return self.collection + SPARSE_SUFFIX

    def _sparse_exists(self) -> bool:
        if not self._sparse_ready:
            name = self._sparse_name
            self._sparse_ready = _client(lambda: self.client.collection_exists(name))
        return self._sparse_ready

    def _ensure_sparse(self) -> None:
        with self._guard:
            if self._sparse_exists():
                return
            params = {SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)}
            try:
                _client(
                    lambda: self.client.create_collection(
                        self._sparse_name, vectors_config={}, sparse_vectors_config=params
                    )
                )
            except ProviderError:
                if not _client(lambda: self.client.collection_exists(self._sparse_name)):
                    raise
            keyword = models.PayloadSchemaType.KEYWORD
            _client(
                lambda: self.client.create_payload_index(
                    self._sparse_name, CONTENT_KEY, field_schema=keyword, wait=True
                )
            )
            self._sparse_ready = True

    def _exists(self) -> bool:
        if not self._ready:
            self._ready = _client(lambda: self.client.collection_exists(self.collection))
        return self._ready

    def _ensure_collection(self, dimensions: int) -> None:
        if self._ready:
            return
        with self._guard:
            if not self._exists():
                self._create_collection(dimensions)
                self._ready = True

    def _create_collection(self, dimensions: int) -> None:
        config = models.VectorParams(size=dimensions, distance=models.Distance.COSINE)
        try:
            _client(lambda: self.client.create_collection(self.collection, vectors_config=config))
        except ProviderError:
            # Another worker may have created it between our check and our create.
            if not _client(lambda: self.client.collection_exists(self.collection)):
                raise
        # Idempotent, so also run when another worker won the race (it may have died before
        # indexing): without the index every filtered search scans the whole collection.
        keyword = models.PayloadSchemaType.KEYWORD
        _client(
            lambda: self.client.create_payload_index(
                self.collection, CONTENT_KEY, field_schema=keyword, wait=True
            )
        )
