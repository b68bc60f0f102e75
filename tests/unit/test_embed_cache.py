"""Embedding cache: content-addressed keys, float32 round trip, TTL, and embed_with_cache
sending only what no job embedded before (real Redis, flushed per test)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest
import redis

from tests.conftest import redis_url
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.jobs.embed_cache import PREFIX, RedisEmbeddingCache, cache_key
from webctx.protocols import Embeddings
from webctx.stages.embed import CachedEmbedOutcome, cache_text, embed_with_cache
from webctx.tokens import count_tokens


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url())
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


class CountingEmbedder:
    """HashEmbedder that records every text it was asked to embed."""

    def __init__(self) -> None:
        self.inner = HashEmbedder(dimensions=64)
        self.model = "hash-64"
        self.sent: list[str] = []

    def embed(self, texts: Sequence[str]) -> Embeddings:
        self.sent += texts
        return self.inner.embed(texts)


def run(
    texts: list[str], embedder: CountingEmbedder, cache: RedisEmbeddingCache
) -> CachedEmbedOutcome:
    return embed_with_cache(
        texts,
        embedder,
        cache=cache,
        limiter=None,
        max_inputs=4,
        max_tokens_per_request=1000,
        max_input_tokens=500,
        max_attempts=2,
    )


def test_key_depends_on_model_dimensions_and_normalised_text() -> None:
    key = cache_key("m", None, "a  b\n c ")
    assert key.startswith(PREFIX)
    assert key == cache_key("m", None, "a b c")
    assert key != cache_key("m", 256, "a b c")
    assert key != cache_key("m2", None, "a b c")
    assert key != cache_key("m", None, "a b C")


def test_vectors_round_trip_as_float32_with_a_ttl(r: redis.Redis) -> None:
    cache = RedisEmbeddingCache(r, ttl_s=100)
    vectors = [[0.1, -0.5, 2.0], [1e-3, 0.0, 3.25]]
    cache.set_many("m", None, ["one", "two"], vectors)
    got = cache.get_many("m", None, ["two", "three", "one"])
    assert got[1] is None
    np.testing.assert_allclose(np.array([got[2], got[0]]), np.array(vectors), rtol=1e-6)
    assert len(r.get(cache_key("m", None, "one")) or b"") == 3 * 4
    assert 0 < r.ttl(cache_key("m", None, "one")) <= 100


def test_a_second_run_embeds_nothing_and_reports_tokens_saved(r: redis.Redis) -> None:
    cache, embedder = RedisEmbeddingCache(r), CountingEmbedder()
    texts = [f"chunk {i} about celery and redis" for i in range(10)] + [
        "chunk 0 about  celery and redis"
    ]
    first = run(texts, embedder, cache)
    assert len(embedder.sent) == 10  # the whitespace variant is the same chunk
    assert first.cache_hits == 1
    assert first.vectors[10] == first.vectors[0]
    embedder.sent.clear()
    second = run(texts, embedder, cache)
    assert embedder.sent == [] and second.tokens == 0 and second.requests == 0
    assert second.cache_hits == 11
    assert second.tokens_saved == sum(count_tokens(t) for t in texts)
    np.testing.assert_allclose(np.array(second.vectors), np.array(first.vectors), rtol=1e-6)


def test_only_unseen_chunks_are_sent(r: redis.Redis) -> None:
    cache, embedder = RedisEmbeddingCache(r), CountingEmbedder()
    run(["old one", "old two"], embedder, cache)
    embedder.sent.clear()
    out = run(["old two", "new", "old one"], embedder, cache)
    assert embedder.sent == ["new"]
    assert out.cache_hits == 2 and len(out.vectors) == 3


def test_the_cache_key_text_collapses_every_unicode_whitespace_run_as_before() -> None:
    # cache_text moved from a regex (\s+ -> " ", stripped) to str.split: every key ever
    # written must come out the same, or the cache would miss it.
    import re

    spaces = [chr(c) for c in range(0x3000 + 1) if chr(c).isspace()]
    texts = ["  a \t b\n\nc  ", "\u00a0x\u2003y\u3000", "".join(spaces) + "z" + "".join(spaces),
             "no-space", ""]  # fmt: skip
    for text in texts:
        assert cache_text(text) == re.sub(r"\s+", " ", text).strip()
