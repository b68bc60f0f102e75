"""The vector store on an embedded qdrant-edge shard in a local directory (single process),
in every role (VectorStore, IndexWriter, IndexReader) and Optimizable: the engine builds
its HNSW graphs only when asked.

The shard is created at the first upsert, when the vector dimension becomes known, unless
`dimensions` is given. One process at a time: an exclusive flock on a file in the directory
turns a second opener into a ConfigError with a clear message (the engine's own WAL lock
would fail later with "Can't init WAL: Kind(WouldBlock)").

Open it in the process that uses it, after any fork (Celery: worker_process_init). The engine
is safe to call from many threads: it synchronises internally, and holds the GIL while it
works, so calls do not run in parallel; a lock guards only creation and close.

A write is durable when the call returns: every write flushes the shards it changed before
returning (about 8 ms for a page's points), except `upsert_unflushed`, which a research
job's store step uses so that one flush makes many pages durable
(webctx/jobs/group_flush.py). Shards are created without the engine's write-ahead log,
which would write each update twice and keep its open 32 MB segment in the worker's
memory; the store's writes come a page at a time, and a flush follows them within seconds.
A shard created with a log by an earlier webctx keeps it (the engine fixes the choice at
creation); the same flushes keep that log from growing with everything ever stored.
"""

from __future__ import annotations

import fcntl
import functools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import qdrant_edge as qe

from webctx.adapters.edge_tuning import Tuning
from webctx.errors import ConfigError, ProviderError
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

PROVIDER = "qdrant-edge"
SPARSE = "bm25"
SPARSE_SUFFIX = ".sparse"
"""The sparse (BM25) vectors of the index live in a sibling shard `<path>.sparse`: the dense
shard's schema stays as it is (existing shards keep loading), and only the holder of
`<path>`'s lock ever opens it."""
LOCK_FILE = ".webctx.lock"
_DATATYPES = {"float32": qe.VectorStorageDatatype.Float32,
              "float16": qe.VectorStorageDatatype.Float16}  # fmt: skip
_CONFIG_FILE = "edge_config.json"  # written by EdgeShard.create: its presence means "load"

T = TypeVar("T")


def _engine(call: Callable[[], T]) -> T:
    """Run one engine call, turning its plain `Exception`s into ProviderError."""
    try:
        return call()
    except Exception as exc:  # the engine raises bare Exception for every failure
        raise ProviderError(PROVIDER, str(exc)) from exc


def store_holder(path: Path) -> str | None:
    """The pid holding the store at `path` open, or None when no process does."""
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # closing drops a lock we took
    return None


def _lock_directory(path: Path) -> int:
    """Take the exclusive lock of the shard directory, or raise ConfigError."""
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(
            f"vector store {path} is in use by another process (pid {holder}); "
            "use WEBCTX_QDRANT_URL for several worker processes"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


CHUNK_FIELDS = (*Chunk.model_fields, "url", "model")
"""The payload fields a retrieved point is rebuilt from (not every tenant's live marks)."""


def _stored(pid: str, payload: Mapping[str, object]) -> StoredChunk:
    """A retrieved point, without its vector."""
    chunk = Chunk.model_validate({k: payload[k] for k in Chunk.model_fields})
    return StoredChunk(id=pid, vector=[], chunk=chunk, url=str(payload["url"]),
                       model=str(payload.get("model", "")))  # fmt: skip


def _dense(vector: object) -> list[float]:
    """The default dense vector of a returned point."""
    if isinstance(vector, dict):  # named vectors: ours is the unnamed one
        vector = vector.get("")
    if not isinstance(vector, list):
        raise ProviderError(PROVIDER, f"unexpected vector type {type(vector).__name__}")
    return vector  # the engine's own list of floats (a model built from it validates them)


class EdgeVectorStore:
    """Points in a qdrant-edge shard at `path`, cosine distance, a keyword field index on
    content_sha256 and site."""

    def __init__(
        self,
        path: Path,
        *,
        dimensions: int | None = None,
        datatype: VectorDatatype = "float32",
        tuning: Tuning | None = None,
    ) -> None:
        self.path = path
        self.tuning = tuning or Tuning()
        self._params = self.tuning.search_params()
        self._datatype = _DATATYPES[datatype]
        path.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = _lock_directory(path)
        self._pid = os.getpid()
        self._guard = threading.Lock()
        self._shard: qe.EdgeShard | None = None
        self._sparse: qe.EdgeShard | None = None
        self._marked: set[str] = set()  # tenant keys whose mark fields have field indexes
        try:
            if (path / _CONFIG_FILE).exists():
                # As created: an earlier webctx's shard keeps its layout (export and
                # import it to take the current one, docs/index.md).
                self._shard = self._open(_engine(lambda: qe.EdgeShard.load(str(path))))
            elif dimensions is not None:
                self._shard = self._create(dimensions)
        except BaseException:
            self._unlock()
            raise

    def upsert(self, points: Sequence[StoredChunk]) -> None:
        """Insert or overwrite points by id; the first upsert fixes the dimension."""
        self.upsert_unflushed(points)
        self.flush()  # durable on return

    def upsert_unflushed(self, points: Sequence[StoredChunk]) -> None:
        """`upsert` without its flush: searchable at once, durable at the next `flush`
        (a process killed before it loses the write)."""
        if not points:
            return
        shard = self._current() or self._create_once(len(points[0].vector))
        _keep_marks_upsert(shard, [(p.id, p.vector, point_payload(p)) for p in points])

    def flush(self) -> None:
        """Make every write so far durable. The engine holds the GIL throughout (8 ms to
        over 100 ms with the disk busy): the whole process waits."""
        shard = self._current()
        if shard is not None:
            _engine(shard.flush)

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
        pages = qe.FieldCondition(CONTENT_KEY, match=qe.MatchAny(list(content_sha256s)))
        return self._dense_query(vector, limit, qe.Filter(must=[pages]), vectors=with_vectors)

    def vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        """The stored vectors of the points among `ids` that exist."""
        shard = self._current()
        if shard is None or not ids:
            return {}
        wanted: list[qe.PointId] = list(ids)
        records = _engine(lambda: shard.retrieve(wanted, with_payload=False, with_vector=True))
        return {str(r.id): _dense(r.vector) for r in records}

    def rank_live(self, vector: Sequence[float], *, limit: int, scope: IndexScope) -> list[str]:
        """Point ids of the nearest chunks among the scope's live pages, best first, without
        payloads."""
        if scope.selects_nothing:
            return []
        hits = self._dense_hits(vector, limit, _scope_filter(scope), payload=False)
        return [str(hit.id) for hit in hits]

    def _dense_query(
        self, vector: Sequence[float], limit: int, where: qe.Filter, *, vectors: bool = True
    ) -> list[ScoredChunk]:
        hits = self._dense_hits(vector, limit, where, vectors=vectors)
        return [
            scored_chunk(hit.payload or {}, score=hit.score,
                         vector=_dense(hit.vector) if vectors else [])
            for hit in hits
        ]  # fmt: skip

    def _dense_hits(
        self,
        vector: Sequence[float],
        limit: int,
        where: qe.Filter,
        *,
        vectors: bool = False,
        payload: bool = True,
    ) -> list[qe.ScoredPoint]:
        shard = self._current()
        if shard is None or limit < 1:
            return []
        request = qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest([float(x) for x in vector]),
            filter=where,
            with_payload=payload,
            with_vector=vectors,
            params=self._params,
        )
        return _engine(lambda: shard.query(request))

    def count(self) -> int:
        """Number of points held."""
        shard = self._current()
        if shard is None:
            return 0
        return _engine(lambda: shard.count(qe.CountRequest(exact=True)))

    def delete_pages(self, content_sha256s: Sequence[str]) -> None:
        """Delete every point (dense and sparse) of the given pages."""
        if not content_sha256s:
            return
        pages = qe.FieldCondition(CONTENT_KEY, match=qe.MatchAny(list(content_sha256s)))
        delete = qe.UpdateOperation.delete_points_by_filter(qe.Filter(must=[pages]))
        for shard in (self._current(), self._sparse_shard(create=False)):
            if shard is not None:
                _engine(functools.partial(shard.update, delete))
                _engine(shard.flush)  # durable on return

    def upsert_sparse(self, points: Sequence[StoredChunk]) -> None:
        """Index the points' chunk texts as BM25 sparse vectors, under the same ids."""
        if not points:
            return
        shard = self._sparse_shard(create=True)
        assert shard is not None
        batch: list[tuple[str, object, dict[str, object]]] = []
        for p in points:
            sv = document_vector(p.chunk.text)
            batch.append((p.id, {SPARSE: qe.SparseVector(sv.indices, sv.values)},
                          sparse_payload(p)))  # fmt: skip
        _keep_marks_upsert(shard, batch)
        _engine(shard.flush)  # durable on return

    def rank_live_sparse(self, text: str, *, limit: int, scope: IndexScope) -> list[str]:
        """Point ids of the best BM25 matches among the scope's live pages, best first, without
        payloads."""
        if scope.selects_nothing:
            return []
        return [str(hit.id) for hit in self._sparse_hits(text, limit, _scope_filter(scope),
                                                         payload=False)]  # fmt: skip

    def retrieve(self, ids: Sequence[str]) -> dict[str, StoredChunk]:
        """The points of these ids, without vectors: from the dense shard, else the sparse
        one (whose points written by an earlier webctx still hold their chunk); absent ids
        are left out."""
        found: dict[str, StoredChunk] = {}
        for shard in (self._current(), self._sparse_shard(create=False)):
            wanted: list[qe.PointId] = [pid for pid in ids if pid not in found]
            if shard is None or not wanted:
                continue
            fields: list[str] = list(CHUNK_FIELDS)
            retrieve = functools.partial(shard.retrieve, wanted, with_payload=fields,
                                         with_vector=False)  # fmt: skip
            for record in _engine(retrieve):
                if "text" in (record.payload or {}):  # sparse points hold no text any more
                    found[str(record.id)] = _stored(str(record.id), record.payload or {})
        return found

    def _sparse_hits(
        self, text: str, limit: int, where: qe.Filter, *, payload: bool = True
    ) -> list[qe.ScoredPoint]:
        shard = self._sparse_shard(create=False)
        sv = query_vector(text)
        if shard is None or limit < 1 or not sv.indices:
            return []
        request = qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(qe.SparseVector(sv.indices, sv.values), using=SPARSE),
            filter=where,
            with_payload=payload,
        )
        return _engine(lambda: shard.query(request))

    def mark_pages(
        self, *, tenant_key: str, generation: int, live: Mapping[str, str], dead: Sequence[str]
    ) -> None:
        """Make `live` pages (hash -> site) visible from `generation`, `dead` ones not."""
        shards = [s for s in (self._current(), self._sparse_shard(create=False)) if s is not None]
        if tenant_key not in self._marked:  # info() per mark would cost more than the mark
            integer = qe.PayloadSchemaType.Integer
            for shard in shards:
                fields = {from_key(tenant_key): integer, until_key(tenant_key): integer}
                _create_field_indexes(shard, fields)
            if len(shards) == 2:
                self._marked.add(tenant_key)
        for shard in shards:
            for op in _mark_operations(tenant_key, generation, live, dead):
                _engine(functools.partial(shard.update, op))
            _engine(shard.flush)  # durable on return

    def optimize(self) -> bool:
        """Run the engine's optimizers (HNSW for segments past the indexing threshold).

        The engine never optimizes on its own, and holds the GIL while it does: the whole
        process waits (minutes for 100,000 unindexed 384-dim points on 2 cores)."""
        built = False
        for shard in (self._current(), self._sparse_shard(create=False)):
            if shard is not None:
                built = _engine(shard.optimize) or built
        return built

    def unindexed(self) -> int:
        """Dense points not yet in an HNSW graph (searched by brute force)."""
        shard = self._current()
        if shard is None:
            return 0
        info = _engine(shard.info)
        return max(0, info.points_count - info.indexed_vectors_count)

    def _sparse_shard(self, *, create: bool) -> qe.EdgeShard | None:
        self._current()  # same fork/closed checks as the dense shard
        with self._guard:
            if self._sparse is None:
                path = self.path.with_name(self.path.name + SPARSE_SUFFIX)
                if (path / _CONFIG_FILE).exists():
                    self._sparse = self._open(_engine(lambda: qe.EdgeShard.load(str(path))))
                elif create:
                    path.mkdir(parents=True, exist_ok=True)
                    params = {SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)}
                    config = qe.EdgeConfig(sparse_vectors=params, wal_enabled=False)
                    self._sparse = self._open(
                        _engine(lambda: qe.EdgeShard.create(str(path), config))
                    )
            return self._sparse

    def close(self) -> None:
        """Flush and close the shard, then release the directory for another process."""
        with self._guard:
            shard, self._shard = self._shard, None
            sparse, self._sparse = self._sparse, None
            try:
                for open_shard in (shard, sparse):
                    if open_shard is not None:
                        _engine(open_shard.flush)
                        _engine(open_shard.close)
            finally:
                self._unlock()

    def __enter__(self) -> EdgeVectorStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _current(self) -> qe.EdgeShard | None:
        """The shard, or None before the first upsert; raises once closed or after a fork."""
        if os.getpid() != self._pid:
            # A forked child shares the parent's flock and engine state: two writers, no lock.
            raise ConfigError(
                f"vector store {self.path} was opened before a fork; open it in each worker "
                "process (worker_process_init), or use WEBCTX_QDRANT_URL"
            )
        if self._lock_fd is None:
            raise ProviderError(PROVIDER, f"vector store {self.path} is closed")
        return self._shard

    def _create_once(self, dimensions: int) -> qe.EdgeShard:
        with self._guard:  # two threads' first upserts must not both create the shard
            shard = self._current()
            if shard is None:
                shard = self._shard = self._create(dimensions)
            return shard

    def _create(self, dimensions: int) -> qe.EdgeShard:
        config = self.tuning.config(self.tuning.vector_params(dimensions, self._datatype))
        return self._open(_engine(lambda: qe.EdgeShard.create(str(self.path), config)))

    @staticmethod
    def _open(shard: qe.EdgeShard) -> qe.EdgeShard:
        # Without the keyword field index a filtered search scans every point (140 ms vs 0.3 ms
        # at 50k points), so also add it to a shard that lacks it.
        keyword = qe.PayloadSchemaType.Keyword
        _create_field_indexes(shard, {CONTENT_KEY: keyword, SITE_KEY: keyword})
        return shard

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock


def _keep_marks_upsert(
    shard: qe.EdgeShard, points: Sequence[tuple[str, object, dict[str, object]]]
) -> None:
    """Upsert (id, vector, payload) without erasing what else the payload holds.

    A plain upsert replaces the whole payload, and so would wipe the index's live marks
    from a content-addressed point a research job stores again. New points are inserted
    (insert-only: one stored meanwhile by another thread is not overwritten); existing ones
    get their vector replaced and their payload fields merged."""
    ids: list[qe.PointId] = [pid for pid, _, _ in points]
    found = _engine(lambda: shard.retrieve(ids, with_payload=False, with_vector=False))
    existing = {str(record.id) for record in found}
    fresh = [qe.Point(pid, vector, payload) for pid, vector, payload in points  # type: ignore[arg-type]
             if pid not in existing]  # fmt: skip
    if fresh:
        insert = qe.UpdateOperation.upsert_points(fresh, update_mode=qe.UpdateMode.InsertOnly)
        _engine(functools.partial(shard.update, insert))
    for pid, vector, payload in points:
        if pid in existing:
            vectors = qe.UpdateOperation.update_vectors([qe.PointVectors(pid, vector)])  # type: ignore[arg-type]
            _engine(functools.partial(shard.update, vectors))
            merge = qe.UpdateOperation.set_payload([pid], payload)
            _engine(functools.partial(shard.update, merge))


def _create_field_indexes(shard: qe.EdgeShard, fields: Mapping[str, qe.PayloadSchemaType]) -> None:
    """Create the payload (field) indexes the shard lacks: a filter on a field without one
    scans every point."""
    schema = _engine(shard.info).payload_schema
    for name, kind in fields.items():
        if name not in schema:
            op = qe.UpdateOperation.create_field_index(name, kind)
            _engine(functools.partial(shard.update, op))


def _scope_filter(scope: IndexScope) -> qe.Filter:
    """Live for the tenant at the scope's generation, narrowed to a site or some pages."""
    at = float(scope.generation)
    must = [qe.FieldCondition(from_key(scope.tenant_key), range=qe.RangeFloat(lte=at))]
    if scope.site:
        must.append(qe.FieldCondition(SITE_KEY, match=qe.MatchValue(scope.site.lower())))
    if scope.content_sha256s is not None:
        must.append(qe.FieldCondition(CONTENT_KEY, match=qe.MatchAny(list(scope.content_sha256s))))
    gone = qe.FieldCondition(until_key(scope.tenant_key), range=qe.RangeFloat(lte=at))
    return qe.Filter(must=must, must_not=[gone])  # type: ignore[arg-type]


def _pages(hashes: Sequence[str]) -> qe.Filter:
    return qe.Filter(must=[qe.FieldCondition(CONTENT_KEY, match=qe.MatchAny(list(hashes)))])


def _mark_operations(
    tk: str, generation: int, live: Mapping[str, str], dead: Sequence[str]
) -> list[qe.UpdateOperation]:
    """Mark live pages (from, site; then clear an old until), then dead ones (until)."""
    ops = []
    by_site: dict[str, list[str]] = {}
    for sha, site in live.items():
        by_site.setdefault(site, []).append(sha)
    for site, hashes in by_site.items():
        payload = {from_key(tk): generation, SITE_KEY: site}
        ops.append(qe.UpdateOperation.set_payload_by_filter(_pages(hashes), payload))
    if live:
        ops.append(qe.UpdateOperation.delete_payload_by_filter(_pages(list(live)), [until_key(tk)]))
    if dead:
        ops.append(
            qe.UpdateOperation.set_payload_by_filter(_pages(dead), {until_key(tk): generation})
        )
    return ops
