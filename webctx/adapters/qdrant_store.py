"""The vector store on a Qdrant collection through qdrant-client (a server, or its local
mode), in every role (VectorStore, IndexWriter, IndexReader).

The collection is created at the first upsert, when the vector dimension becomes known,
with cosine distance and a keyword field index on content_sha256 (the filter of every
search).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import grpc
import httpx
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from webctx.errors import ProviderError, ProviderUnavailable
from webctx.models import Chunk, ScoredChunk, StoredChunk
from webctx.protocols import IndexScope, VectorDatatype
from webctx.stages.sparse import document_vector, query_vector
from webctx.stages.store import (
    CONTENT_KEY,
    SITE_KEY,
    from_key,
    point_payload,
    scored_chunk,
    sparse_payload,
    until_key,
)

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


CHUNK_FIELDS = (*Chunk.model_fields, "url", "model")
"""The payload fields a retrieved point is rebuilt from (not every tenant's live marks)."""


def _stored(pid: str, payload: Mapping[str, object]) -> StoredChunk:
    """A retrieved point, without its vector."""
    chunk = Chunk.model_validate({k: payload[k] for k in Chunk.model_fields})
    return StoredChunk(id=pid, vector=[], chunk=chunk, url=str(payload["url"]),
                       model=str(payload.get("model", "")))  # fmt: skip


def _dense(vector: object) -> list[float]:
    """The default dense vector of a returned point."""
    if not isinstance(vector, list):
        raise ProviderError(PROVIDER, f"unexpected vector type {type(vector).__name__}")
    return [float(x) for x in vector]


class QdrantVectorStore:
    """Points in one Qdrant collection, cosine distance, a keyword field index on
    content_sha256 and site."""

    def __init__(
        self, client: QdrantClient, *, collection: str, datatype: VectorDatatype = "float32"
    ) -> None:
        self.client = client
        self.collection = collection
        self._datatype = models.Datatype.FLOAT16 if datatype == "float16" else None
        self._ready = False  # the collection is known to exist
        self._sparse_ready = False
        self._guard = threading.Lock()
        self._field_indexes: set[tuple[str, str]] = set()  # (collection, field) created

    def upsert(self, points: Sequence[StoredChunk]) -> None:
        """Insert or overwrite points by id; the first upsert creates the collection."""
        if not points:
            return
        self._ensure_collection(len(points[0].vector))
        structs = [
            models.PointStruct(id=p.id, vector=list(p.vector), payload=point_payload(p))
            for p in points
        ]
        self._keep_marks_upsert(self.collection, structs)

    def search(
        self,
        vector: Sequence[float],
        *,
        limit: int,
        content_sha256s: Sequence[str],
        with_vectors: bool = True,
    ) -> list[ScoredChunk]:
        """Nearest chunks by cosine similarity among the given pages, with vectors unless
        `with_vectors` is False."""
        if not content_sha256s:
            return []
        return self._dense_query(vector, limit, _pages(content_sha256s), vectors=with_vectors)

    def vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        """The stored vectors of the points among `ids` that exist."""
        if not ids or not self._exists():
            return {}
        records = _client(functools.partial(
            self.client.retrieve, self.collection, list(ids), with_payload=False,
            with_vectors=True))  # fmt: skip
        return {str(r.id): _dense(r.vector) for r in records}

    def rank_live(self, vector: Sequence[float], *, limit: int, scope: IndexScope) -> list[str]:
        """Point ids of the nearest chunks among the scope's live pages, best first, without
        payloads."""
        if scope.selects_nothing:
            return []
        hits = self._dense_hits(vector, limit, _scope_filter(scope), payload=False)
        return [str(hit.id) for hit in hits]

    def _dense_query(
        self, vector: Sequence[float], limit: int, where: models.Filter, *, vectors: bool = True
    ) -> list[ScoredChunk]:
        return [
            scored_chunk(hit.payload or {}, score=hit.score,
                         vector=_dense(hit.vector) if vectors else [])
            for hit in self._dense_hits(vector, limit, where, vectors=vectors)
        ]  # fmt: skip

    def _dense_hits(
        self,
        vector: Sequence[float],
        limit: int,
        where: models.Filter,
        *,
        vectors: bool = False,
        payload: bool = True,
    ) -> list[models.ScoredPoint]:
        if limit < 1 or not self._exists():
            return []
        response = _client(
            lambda: self.client.query_points(
                self.collection,
                query=[float(x) for x in vector],
                query_filter=where,
                limit=limit,
                with_payload=payload,
                with_vectors=vectors,
            )
        )
        return response.points

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
            structs.append(models.PointStruct(id=p.id, vector=vector, payload=sparse_payload(p)))
        self._keep_marks_upsert(self._sparse_name, structs)

    def mark_pages(
        self, *, tenant_key: str, generation: int, live: Mapping[str, str], dead: Sequence[str]
    ) -> None:
        """Make `live` pages (hash -> site) visible from `generation`, `dead` ones not."""
        integer, keyword = models.PayloadSchemaType.INTEGER, models.PayloadSchemaType.KEYWORD
        fields = {from_key(tenant_key): integer, until_key(tenant_key): integer,
                  SITE_KEY: keyword}  # fmt: skip
        by_site: dict[str, list[str]] = {}
        for sha, site in live.items():
            by_site.setdefault(site, []).append(sha)
        for name, present in ((self.collection, self._exists()),
                              (self._sparse_name, self._sparse_exists())):  # fmt: skip
            if not present:
                continue
            self._create_field_indexes(name, fields)
            ops: list[models.UpdateOperation] = [
                models.SetPayloadOperation(set_payload=models.SetPayload(
                    payload={from_key(tenant_key): generation, SITE_KEY: site},
                    filter=_pages(hashes)))
                for site, hashes in by_site.items()
            ]  # fmt: skip
            if live:
                ops.append(models.DeletePayloadOperation(delete_payload=models.DeletePayload(
                    keys=[until_key(tenant_key)], filter=_pages(list(live)))))  # fmt: skip
            if dead:
                ops.append(models.SetPayloadOperation(set_payload=models.SetPayload(
                    payload={until_key(tenant_key): generation}, filter=_pages(dead))))  # fmt: skip
            # One request, applied in order: from (and site) first, the old `until` after.
            _client(functools.partial(self.client.batch_update_points, name,
                                      update_operations=ops, wait=True))  # fmt: skip

    def _keep_marks_upsert(self, name: str, structs: list[models.PointStruct]) -> None:
        """Upsert without erasing what else the payload holds (the index's live marks on a
        content-addressed point a research job stores again): new points are inserted
        (insert-only), existing ones get their vector replaced and payload fields merged.
        wait=True throughout: the next task (rank) must see these points."""
        ids = [s.id for s in structs]
        found = _client(functools.partial(self.client.retrieve, name, ids=ids,
                                          with_payload=False, with_vectors=False))  # fmt: skip
        existing = {str(record.id) for record in found}
        fresh = [s for s in structs if str(s.id) not in existing]
        if fresh:
            _client(functools.partial(self.client.upsert, name, points=fresh, wait=True))
        ops: list[models.UpdateOperation] = []
        for struct in structs:
            if str(struct.id) in existing:
                ops.append(
                    models.UpdateVectorsOperation(
                        update_vectors=models.UpdateVectors(
                            points=[models.PointVectors(id=struct.id, vector=struct.vector)]
                        )
                    )
                )
                ops.append(models.SetPayloadOperation(set_payload=models.SetPayload(
                    payload=struct.payload or {}, points=[struct.id])))  # fmt: skip
        if ops:
            _client(functools.partial(self.client.batch_update_points, name,
                                      update_operations=ops, wait=True))  # fmt: skip

    def _create_field_indexes(
        self, name: str, fields: Mapping[str, models.PayloadSchemaType]
    ) -> None:
        """Create the payload (field) indexes a collection lacks, once per process."""
        for field, kind in fields.items():
            if (name, field) not in self._field_indexes:
                _client(functools.partial(self.client.create_payload_index, name, field,
                                          field_schema=kind, wait=True))  # fmt: skip
                self._field_indexes.add((name, field))

    def rank_live_sparse(self, text: str, *, limit: int, scope: IndexScope) -> list[str]:
        """Point ids of the best BM25 matches among the scope's live pages, best first, without
        payloads."""
        if scope.selects_nothing:
            return []
        hits = self._sparse_hits(text, limit, _scope_filter(scope), payload=False)
        return [str(hit.id) for hit in hits]

    def retrieve(self, ids: Sequence[str]) -> dict[str, StoredChunk]:
        """The points of these ids, without vectors: from the dense collection, else the
        sparse one (whose points written by an earlier webctx still hold their chunk); absent
        ids are left out."""
        found: dict[str, StoredChunk] = {}
        for name, exists in ((self.collection, self._exists),
                             (self._sparse_name, self._sparse_exists)):  # fmt: skip
            wanted: list[models.ExtendedPointId] = [pid for pid in ids if pid not in found]
            if not wanted or not exists():
                continue
            records = _client(functools.partial(
                self.client.retrieve, name, wanted, with_payload=list(CHUNK_FIELDS),
                with_vectors=False))  # fmt: skip
            for record in records:
                if "text" in (record.payload or {}):  # sparse points hold no text any more
                    found[str(record.id)] = _stored(str(record.id), record.payload or {})
        return found

    def _sparse_hits(
        self, text: str, limit: int, where: models.Filter, *, payload: bool = True
    ) -> list[models.ScoredPoint]:
        sv = query_vector(text)
        if limit < 1 or not sv.indices or not self._sparse_exists():
            return []
        response = _client(
            lambda: self.client.query_points(
                self._sparse_name,
                query=models.SparseVector(indices=sv.indices, values=sv.values),
                using=SPARSE,
                query_filter=where,
                limit=limit,
                with_payload=payload,
            )
        )
        return response.points

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
            self._create_field_indexes(self._sparse_name, {CONTENT_KEY: keyword, SITE_KEY: keyword})
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
        config = models.VectorParams(
            size=dimensions, distance=models.Distance.COSINE, datatype=self._datatype
        )
        try:
            _client(lambda: self.client.create_collection(self.collection, vectors_config=config))
        except ProviderError:
            # Another worker may have created it between our check and our create.
            if not _client(lambda: self.client.collection_exists(self.collection)):
                raise
        # Idempotent, so also run when another worker won the race (it may have died before
        # indexing): without the field index every filtered search scans the whole collection.
        keyword = models.PayloadSchemaType.KEYWORD
        self._create_field_indexes(self.collection, {CONTENT_KEY: keyword, SITE_KEY: keyword})


def _pages(hashes: Sequence[str]) -> models.Filter:
    return models.Filter(
        must=[models.FieldCondition(key=CONTENT_KEY, match=models.MatchAny(any=list(hashes)))]
    )


def _scope_filter(scope: IndexScope) -> models.Filter:
    """Live for the tenant at the scope's generation, narrowed to a site or some pages."""
    at = scope.generation
    must: list[models.Condition] = [
        models.FieldCondition(key=from_key(scope.tenant_key), range=models.Range(lte=at))
    ]
    if scope.site:
        must.append(
            models.FieldCondition(key=SITE_KEY, match=models.MatchValue(value=scope.site.lower()))
        )
    if scope.content_sha256s is not None:
        must.append(
            models.FieldCondition(
                key=CONTENT_KEY, match=models.MatchAny(any=list(scope.content_sha256s))
            )
        )
    gone = models.FieldCondition(key=until_key(scope.tenant_key), range=models.Range(lte=at))
    return models.Filter(must=must, must_not=[gone])
