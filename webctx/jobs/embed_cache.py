"""Content-addressed embedding cache in Redis: a chunk seen in any job is embedded once.

Key: `webctx:emb:` + sha256(model, dimensions, whitespace-normalised text); value: the
vector as little-endian float32 bytes (6 KiB for 1536 dimensions, 1.5 KiB for 384).

Eviction: every entry has a TTL (`ttl_s`, default 30 days), refreshed on each hit, so
text no job touches for that long leaves; the state Redis runs `noeviction` (the broker's
rule), so the TTL is the bound on size: about (vector bytes + 90) x distinct chunks of
the last `ttl_s`. On a dedicated cache Redis, `maxmemory-policy volatile-lru` adds a hard
cap; a lost entry only costs one re-embedding.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import redis

from webctx.stages.embed import cache_text

if TYPE_CHECKING:  # numpy loads where vectors are handled
    import numpy as np

PREFIX = "webctx:emb:"


def cache_key(model: str, dimensions: int | None, text: str) -> str:
    """The Redis key of `text`'s vector under `model` and `dimensions`."""
    raw = "\x00".join((model, str(dimensions or 0), cache_text(text)))
    return PREFIX + hashlib.sha256(raw.encode()).hexdigest()


class RedisEmbeddingCache:
    """The EmbeddingCache in Redis: batch get/set of vectors; needs a client with
    `decode_responses=False`."""

    def __init__(self, client: redis.Redis, *, ttl_s: int = 30 * 24 * 3600) -> None:
        self._client = client
        self.ttl_s = ttl_s

    def get_many(
        self, model: str, dimensions: int | None, texts: Sequence[str]
    ) -> list[list[float] | None]:
        """The cached vector of each text, or None; one MGET, plus TTL refresh of the hits."""
        if not texts:
            return []
        import numpy as np  # loaded where vectors are handled, not in every client (the CLI)

        keys = [cache_key(model, dimensions, t) for t in texts]
        raw = self._client.mget(keys)
        found: list[list[float] | None] = []
        with self._client.pipeline(transaction=False) as pipe:
            for key, value in zip(keys, raw, strict=True):
                if isinstance(value, bytes) and value:
                    found.append(np.frombuffer(value, dtype="<f4").astype(float).tolist())
                    pipe.expire(key, self.ttl_s)
                else:
                    found.append(None)
            pipe.execute()
        return found

    def set_many(
        self,
        model: str,
        dimensions: int | None,
        texts: Sequence[str],
        vectors: Sequence[Sequence[float]],
    ) -> None:
        """Store each text's vector with the cache TTL (one pipelined round trip)."""
        if len(texts) != len(vectors):
            raise ValueError("one vector per text")
        with self._client.pipeline(transaction=False) as pipe:
            for text, vector in zip(texts, _rows(vectors), strict=True):
                pipe.set(cache_key(model, dimensions, text), vector.tobytes(), ex=self.ttl_s)
            pipe.execute()


def _rows(vectors: Sequence[Sequence[float]]) -> list[np.ndarray]:
    """Each vector as little-endian float32: one conversion of the whole batch when all
    have one length (a page's), else one per vector."""
    import numpy as np

    try:
        return list(np.asarray(vectors, dtype="<f4"))
    except ValueError:  # ragged: vectors of different lengths
        return [np.asarray(v, dtype="<f4") for v in vectors]
