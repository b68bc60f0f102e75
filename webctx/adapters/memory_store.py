"""The vector store in memory (dict + numpy) for unit tests, in every role (VectorStore,
IndexWriter, IndexReader); behaves like Qdrant with cosine."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from webctx.errors import ProviderError
from webctx.models import ScoredChunk, StoredChunk
from webctx.protocols import IndexScope
from webctx.stages.sparse import document_vector, idf, query_vector

Vec = npt.NDArray[np.float32]


def _unit(vector: Sequence[float]) -> Vec:
    """The vector scaled to length 1, as Qdrant stores cosine vectors (zero stays zero)."""
    arr = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(arr))
    return arr / norm if norm > 0 else arr


class MemoryVectorStore:
    """Holds points in a dict; exact cosine search over the filtered pages."""

    def __init__(self) -> None:
        self._points: dict[str, tuple[Vec, StoredChunk]] = {}
        self._dimensions: int | None = None
        self._lock = threading.Lock()
        self._sparse: dict[str, tuple[dict[int, float], StoredChunk]] = {}
        # (tenant key, page hash) -> [from, until]; page hash -> site: the live marks.
        self._marks: dict[tuple[str, str], list[int | None]] = {}
        self._sites: dict[str, str] = {}

    def upsert(self, points: Sequence[StoredChunk]) -> None:
        """Insert or overwrite points by id; the first point fixes the dimension."""
        with self._lock:
            for point in points:
                self._check_dimension(len(point.vector))
            for point in points:
                self._points[point.id] = (_unit(point.vector), point)

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
        pages = set(content_sha256s)
        hits = self._nearest(vector, limit, lambda sha: sha in pages)
        return hits if with_vectors else [h.model_copy(update={"vector": []}) for h in hits]

    def vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        """The stored vectors of the points among `ids` that exist."""
        with self._lock:
            return {pid: self._points[pid][0].tolist() for pid in ids if pid in self._points}

    def rank_live(self, vector: Sequence[float], *, limit: int, scope: IndexScope) -> list[str]:
        """Point ids of the nearest chunks among the scope's live pages, best first."""
        return [point.id for _, point, _ in self._ranked(vector, limit, self._in_scope(scope))]

    def _nearest(
        self, vector: Sequence[float], limit: int, keep: Callable[[str], bool]
    ) -> list[ScoredChunk]:
        return [
            ScoredChunk(chunk=point.chunk, url=point.url, score=score, vector=vec.tolist())
            for vec, point, score in self._ranked(vector, limit, keep)
        ]

    def _ranked(
        self, vector: Sequence[float], limit: int, keep: Callable[[str], bool]
    ) -> list[tuple[Vec, StoredChunk, float]]:
        with self._lock:
            if self._dimensions is None or limit < 1:
                return []
            self._check_dimension(len(vector))
            hits = [p for p in self._points.values() if keep(p[1].chunk.content_sha256)]
        if not hits:
            return []
        scores = np.stack([vec for vec, _ in hits]) @ _unit(vector)
        best = np.argsort(-scores, kind="stable")[:limit]
        return [(hits[i][0], hits[i][1], float(scores[i])) for i in best]

    def count(self) -> int:
        """Number of points held."""
        with self._lock:
            return len(self._points)

    def delete_pages(self, content_sha256s: Sequence[str]) -> None:
        """Delete every point (dense and sparse) of the given pages."""
        pages = set(content_sha256s)
        with self._lock:
            for points in (self._points, self._sparse):
                for pid in [k for k, v in points.items() if v[1].chunk.content_sha256 in pages]:
                    del points[pid]
            for key in [k for k in self._marks if k[1] in pages]:
                del self._marks[key]

    def upsert_sparse(self, points: Sequence[StoredChunk]) -> None:
        """Index the points' chunk texts as BM25 sparse vectors, under the same ids."""
        with self._lock:
            for point in points:
                sv = document_vector(point.chunk.text)
                self._sparse[point.id] = (dict(zip(sv.indices, sv.values, strict=True)), point)

    def rank_live_sparse(self, text: str, *, limit: int, scope: IndexScope) -> list[str]:
        """Point ids of the best BM25 matches among the scope's live pages, best first."""
        return [point.id for _, point in self._bm25_ranked(text, limit, self._in_scope(scope))]

    def retrieve(self, ids: Sequence[str]) -> dict[str, StoredChunk]:
        """The points of these ids (dense, else sparse), without vectors."""
        found: dict[str, StoredChunk] = {}
        with self._lock:
            for pid in ids:
                held = self._points.get(pid) or self._sparse.get(pid)
                if held is not None:
                    found[pid] = held[1].model_copy(update={"vector": []})
        return found

    def mark_pages(
        self, *, tenant_key: str, generation: int, live: Mapping[str, str], dead: Sequence[str]
    ) -> None:
        """Make `live` pages (hash -> site) visible from `generation`, `dead` ones not."""
        with self._lock:
            for sha, site in live.items():
                self._marks[(tenant_key, sha)] = [generation, None]
                self._sites[sha] = site
            for sha in dead:
                self._marks.setdefault((tenant_key, sha), [None, None])[1] = generation

    def _in_scope(self, scope: IndexScope) -> Callable[[str], bool]:
        pages = None if scope.content_sha256s is None else set(scope.content_sha256s)
        site = scope.site.lower() if scope.site else None

        def keep(sha: str) -> bool:
            start, until = self._marks.get((scope.tenant_key, sha), [None, None])
            if start is None or start > scope.generation:
                return False
            if until is not None and until <= scope.generation:
                return False
            if site is not None and self._sites.get(sha) != site:
                return False
            return pages is None or sha in pages

        return keep

    def _bm25_ranked(
        self, text: str, limit: int, keep: Callable[[str], bool]
    ) -> list[tuple[float, StoredChunk]]:
        terms = query_vector(text).indices
        with self._lock:
            docs = list(self._sparse.values())
        weights = {t: idf(len(docs), sum(1 for d, _ in docs if t in d)) for t in terms}
        scored = []
        for doc, point in docs:
            score = sum(weights[t] * doc[t] for t in terms if t in doc)
            if score > 0 and keep(point.chunk.content_sha256):
                scored.append((score, point))
        scored.sort(key=lambda sp: -sp[0])
        return [(float(score), p) for score, p in scored[: max(limit, 0)]]

    def _check_dimension(self, size: int) -> None:
        if self._dimensions is None:
            self._dimensions = size
        elif size != self._dimensions:
            raise ProviderError(
                "memory", f"vector dimension error: expected dim: {self._dimensions}, got {size}"
            )
