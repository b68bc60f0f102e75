"""A deterministic feature-hashing embedder: no model, no server, no download.

It is lexical, not semantic: texts that share words get similar vectors. It serves as
the test fake and as the demo web's embeddings model, and is reported only as a floor
in quality benchmarks.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence

from webctx.protocols import Embeddings

_WORD = re.compile(r"\w+", re.UNICODE)


class HashEmbedder:
    """Hashes lower-cased words and word bigrams into `dimensions` signed buckets."""

    def __init__(self, *, dimensions: int = 256, model: str = "hash-embedding") -> None:
        self.model = model
        self.dimensions = dimensions

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """One L2-normalised vector per text (no rate limits: nothing is sent anywhere)."""
        return Embeddings(self.vectors(texts))

    def vectors(self, texts: Sequence[str]) -> list[list[float]]:
        """One L2-normalised vector per text, as a plain list (what the loopback embeddings
        server answers with)."""
        return [self.embed_one(text) for text in texts]

    def embed_one(self, text: str) -> list[float]:
        """The vector of one text (all zeros but one bucket for an empty text)."""
        vec = [0.0] * self.dimensions
        words = [w.lower() for w in _WORD.findall(text)]
        features = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
        if not features:
            features = ["\x00empty"]
        for feature in features:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dimensions
            sign = 1.0 if digest[4] & 1 else -1.0
            vec[bucket] += sign
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        return [v / norm for v in vec]
