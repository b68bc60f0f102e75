"""Points shaped for the vector store tests: pages named by a word, vectors given."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from webctx.models import Chunk, StoredChunk
from webctx.stages.store import make_points

MODEL = "test-embedding"


def sha(name: str) -> str:
    """The content hash of the page named `name`."""
    return hashlib.sha256(name.encode()).hexdigest()


def make_chunks(page: str, n: int) -> list[Chunk]:
    """`n` chunks of the page named `page`, with non-ASCII text."""
    return [
        Chunk(
            content_sha256=sha(page),
            index=i,
            start=i * 10,
            end=i * 10 + 10,
            text=f"{page} chunk {i} – ünïcode",
            tokens=3,
        )
        for i in range(n)
    ]


def page_points(page: str, vectors: Sequence[Sequence[float]]) -> list[StoredChunk]:
    """One point per vector, of the page named `page`."""
    return make_points(
        make_chunks(page, len(vectors)), vectors, url=f"https://{page}.test/", model=MODEL
    )


def unit(vector: Sequence[float]) -> list[float]:
    """`vector` scaled to length 1 (what a cosine store gives back)."""
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]
