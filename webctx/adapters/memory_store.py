"""An in-memory VectorStore (dict + numpy) for unit tests; behaves like Qdrant with cosine."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from webctx.errors import ProviderError
from webctx.models import ScoredChunk, StoredChunk
from webctx.sparse import document_vector, idf, query_vector

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

    def upsert(self, points: Sequence[StoredChunk]) -> None:
        """Insert or overwrite points by id; the first point fixes the dimension."""
        with self._lock:
            for point in points:
                self._check_dimension(len(point.vector))
            for point in points:
                self._points[point.id] = (_unit(point.vector), point)

    def search(
        self, vector: Sequence[float], *, limit: int, content_sha256s: Sequence[str]
    ) -> list[ScoredChunk]:
        """Nearest chunks by cosine similarity among the given pages, with vectors."""
        pages = set(content_sha256s)
        with self._lock:
            if self._dimensions is None or not pages or limit < 1:
                return []
            self._check_dimension(len(vector))
            hits = [p for p in self._points.values() if p[1].chunk.content_sha256 in pages]
        if not hits:
            return []
        scores = np.stack([vec for vec, _ in hits]) @ _unit(vector)
        best = np.argsort(-scores, kind="stable")[:limit]
        return [
            ScoredChunk(
                chunk=hits[i][1].chunk,
                url=hits[i][1].url,
                score=float(scores[i]),
                vector=hits[i][0].tolist(),
            )
            for i in best
        ]

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

    def upsert_sparse(self, points: Sequence[StoredChunk]) -> None:
        """Index the points' chunk texts as BM25 sparse vectors, under the same ids."""
        with self._lock:
            for point in points:
                sv = document_vector(point.chunk.text)
                self._sparse[point.id] = (dict(zip(sv.indices, sv.values, strict=True)), point)

    def search_sparse(
        self, text: str, *, limit: int, content_sha256s: Sequence[str]
    ) -> list[ScoredChunk]:
        """Best BM25 matches of `text` among the given pages (IDF over every point)."""
        terms = query_vector(text).indices
        pages = set(content_sha256s)
        with self._lock:
            docs = list(self._sparse.values())
        weights = {t: idf(len(docs), sum(1 for d, _ in docs if t in d)) for t in terms}
        scored = []
        for doc, point in docs:
            score = sum(weights[t] * doc[t] for t in terms if t in doc)
            if score > 0 and point.chunk.content_sha256 in pages:
                scored.append((score, point))
        scored.sort(key=lambda sp: -sp[0])
        return [
            ScoredChunk(chunk=p.chunk, url=p.url, score=float(score), vector=[])
            for score, p in scored[: max(limit, 0)]
        ]

    def _check_dimension(self, size: int) -> None:
        if self._dimensions is None:
            self._dimensions = size
        elif size != self._dimensions:
            raise ProviderError(
                "memory", f"vector dimension error: expected dim: {self._dimensions}, got {size}"
            )
