"""Store stage: content-addressed points for embedded chunks, and the payload layout they use.

A point's id is derived from what it holds (page text hash, chunk offsets, model), so a
retried task or a second job that meets the same page overwrites instead of duplicating.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from webctx.models import Chunk, ScoredChunk, StoredChunk
from webctx.protocols import GroupFlushable, VectorStore

# uuid5(NAMESPACE_URL, "https://github.com/webctx/webctx#point"), written out because it is
# fixed forever: changing it re-keys every stored point and duplicates the whole store.
POINT_NAMESPACE = uuid.UUID("013420d6-afae-5302-ba02-3780fd76f2fb")

CONTENT_KEY = "content_sha256"
"""Payload field every adapter filters on (with a keyword field index)."""
SITE_KEY = "site"
"""Payload field: the page's site, lower case (set when a page goes live for the index;
keyword field index)."""


def from_key(tk: str) -> str:
    """Payload field: the generation a page became live for the tenant `tk`."""
    return f"live_{tk}_from"


def until_key(tk: str) -> str:
    """Payload field: the generation a page stopped being live for the tenant `tk`."""
    return f"live_{tk}_until"


UPSERT_BATCH = 256
T = TypeVar("T")


_NAMESPACE_BYTES = POINT_NAMESPACE.bytes


def point_id(content_sha256: str, start: int, end: int, model: str) -> str:
    """The UUIDv5 of one chunk of one page text embedded by one model."""
    # The model goes last: it is the only part that may contain the separator.
    name = f"{content_sha256}:{start}:{end}:{model}".encode()
    # uuid.uuid5, without building a UUID object (a third of a store task's time once):
    # SHA-1 of namespace and name, first 16 bytes, version 5 and the RFC 4122 variant.
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + name).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def vector_lookup(
    store: VectorStore, model: str
) -> Callable[[Sequence[ScoredChunk]], list[list[float]]]:
    """Stored vectors of hits searched without them, by their point ids ([] when gone)."""

    def lookup(hits: Sequence[ScoredChunk]) -> list[list[float]]:
        ids = [point_id(h.chunk.content_sha256, h.chunk.start, h.chunk.end, model) for h in hits]
        found = store.vectors(ids)
        return [found.get(pid, []) for pid in ids]

    return lookup


def make_points(
    chunks: Sequence[Chunk], vectors: Sequence[Sequence[float]], *, url: str, model: str
) -> list[StoredChunk]:
    """Pair each chunk with its vector under a deterministic point id."""
    if len(chunks) != len(vectors):
        raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
    return [
        StoredChunk(
            id=point_id(chunk.content_sha256, chunk.start, chunk.end, model),
            vector=vector if isinstance(vector, list) else [float(x) for x in vector],
            chunk=chunk,
            url=url,
            model=model,
        )
        for chunk, vector in zip(chunks, vectors, strict=True)
    ]


def store_chunks(
    store: VectorStore,
    points: Sequence[StoredChunk],
    *,
    batch_size: int = UPSERT_BATCH,
    durable: bool = True,
) -> int:
    """Upsert points in bounded batches; returns how many were written. With `durable`
    False, a store that flushes (GroupFlushable) leaves them to its next flush."""
    upsert = store.upsert
    if not durable and isinstance(store, GroupFlushable):
        upsert = store.upsert_unflushed
    # Bounded batches keep one request under a server's body limit (1536-dim JSON ~30 KB/point).
    for start in range(0, len(points), batch_size):
        upsert(points[start : start + batch_size])
    return len(points)


def point_payload(point: StoredChunk) -> dict[str, object]:
    """The flat payload stored with a point: the chunk's fields plus url and model."""
    return {**point.chunk.model_dump(), "url": point.url, "model": point.model}


def sparse_payload(point: StoredChunk) -> dict[str, object]:
    """The payload of a sparse (BM25) point: the page hash its filters need (the marks and
    the site come with the marks). Its chunk's text and fields are read from the dense
    point under the same id, so the index keeps one copy of every chunk's text."""
    return {CONTENT_KEY: point.chunk.content_sha256}


def scored_chunk(
    payload: Mapping[str, object], *, score: float, vector: Sequence[float]
) -> ScoredChunk:
    """Rebuild a search hit from a stored payload."""
    return ScoredChunk(
        chunk=Chunk.model_validate(dict(payload)),
        url=str(payload["url"]),
        score=float(score),
        vector=vector if isinstance(vector, list) else list(vector),  # validated as floats
    )


@dataclass
class RawPoint:
    """One stored point as the engine holds it (index export and import): its id, the
    whole payload (live marks included) and its dense vector or sparse (indices, values)."""

    id: str
    payload: dict[str, object]
    dense: list[float] | None = None
    sparse: tuple[list[int], list[float]] | None = None


_MARK = re.compile(r"^live_[0-9a-f]+_(from|until)\Z")


def mark_fields(points: Sequence[RawPoint], *, integer: T) -> dict[str, T]:
    """Field-index schema of every live-mark field the points carry (`integer`: the
    engine's integer type)."""
    return {key: integer for p in points for key in p.payload if _MARK.match(key)}
