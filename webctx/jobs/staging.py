"""Embedded chunks waiting to be stored: the hand-off from the embed task to the store task.

Embedding (chunking, token counting, the provider's round trips) runs on any worker; only
the upsert needs the vector store, and the embedded engine admits one process. So the embed
task leaves a page's chunk spans and vectors here, under the page's content hash and the
store scope (store, model, chunking), and sends the store task only ids: no broker message
carries vectors. The store task rebuilds the chunks from the page text it already has.

An entry lives `STAGING_TTL_S` (a day: far longer than a store task waits in its queue,
short enough that pages of cancelled jobs do not hold Redis memory for the job's 7 days);
the store task drops it once the page's points are written. A store task that finds no
entry (expired, or Redis lost it) embeds the page itself, so a lost entry costs time,
never a page.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from webctx.models import Chunk, Page

if TYPE_CHECKING:  # numpy loads where vectors are handled, not in every client (the CLI)
    import numpy as np

STAGING_TTL_S = 24 * 3600


@dataclass(frozen=True)
class Span:
    """Where a chunk lies in the page text, and its token count."""

    start: int
    end: int
    tokens: int


@dataclass(frozen=True)
class StagedPage:
    """A page's chunk spans and one vector per span."""

    spans: list[Span]
    vectors: np.ndarray  # float32, shape (len(spans), dimensions)

    def chunks(self, page: Page) -> list[Chunk]:
        """The chunks these spans cut from `page` (the page the spans were made from)."""
        return [
            Chunk(
                content_sha256=page.content_sha256,
                index=i,
                start=s.start,
                end=s.end,
                text=page.text[s.start : s.end],
                tokens=s.tokens,
            )
            for i, s in enumerate(self.spans)
        ]


class ChunkStaging:
    """Staged pages in Redis; needs a client with `decode_responses=False`."""

    def __init__(self, client: redis.Redis, *, scope: str, ttl_s: int = STAGING_TTL_S) -> None:
        self._redis = client
        self.scope = scope
        self.ttl_s = ttl_s

    def _key(self, content_sha256: str) -> str:
        return f"webctx:staged:{self.scope}:{content_sha256}"

    def put(self, chunks: Sequence[Chunk], vectors: Sequence[Sequence[float]]) -> None:
        """Stage a page's chunks (all of one page) and their vectors, atomically."""
        if not chunks:
            raise ValueError("nothing to stage")
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        shas = {c.content_sha256 for c in chunks}
        if len(shas) != 1:
            raise ValueError("staged chunks must come from one page")
        import numpy as np

        try:
            matrix = np.asarray(vectors, dtype="<f4")
        except ValueError:  # ragged rows
            matrix = np.empty(0)
        if matrix.ndim != 2:
            raise ValueError("vectors must all have the same dimension")
        spans = [[c.start, c.end, c.tokens] for c in chunks]
        key = self._key(shas.pop())
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping={"spans": json.dumps(spans), "dim": str(matrix.shape[1]),
                                    "vectors": matrix.tobytes()})  # fmt: skip
            pipe.expire(key, self.ttl_s)
            pipe.execute()

    def get(self, content_sha256: str) -> StagedPage | None:
        """The staged page, or None when there is none (or it is unreadable)."""
        raw = self._redis.hmget(self._key(content_sha256), ["spans", "dim", "vectors"])
        spans_raw, dim_raw, blob = raw
        if not (spans_raw and dim_raw and isinstance(blob, bytes)):
            return None
        spans = [Span(*map(int, s)) for s in json.loads(spans_raw)]
        dim = int(dim_raw)
        if dim <= 0 or len(blob) != 4 * dim * len(spans):
            return None  # torn or foreign entry: embed again rather than store garbage
        import numpy as np

        vectors = np.frombuffer(blob, dtype="<f4").reshape(len(spans), dim)
        return StagedPage(spans, vectors)

    def drop(self, content_sha256: str) -> None:
        """Forget a staged page (its points are written)."""
        self._redis.delete(self._key(content_sha256))
