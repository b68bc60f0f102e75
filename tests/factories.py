"""Plain factory functions for test records; override any field by keyword."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime

from webctx.adapters.hash_embedder import HashEmbedder
from webctx.models import Bundle, BundleStats, Chunk, Page, ScoredChunk
from webctx.stages.bundle import build_bundle
from webctx.tokens import count_tokens

DEFAULT_TEXT = (
    "Celery routes tasks through a broker. Workers acknowledge a task after it runs.\n\n"
    "Redis keeps the queue in memory. Append-only files make it survive a restart."
)
_EMBEDDER = HashEmbedder()


def make_page(**overrides: object) -> Page:
    """A valid Page; `content_sha256` follows `url` and `text` unless overridden."""
    url = str(overrides.get("url", "https://example.org/article"))
    text = str(overrides.get("text", DEFAULT_TEXT))
    fields: dict[str, object] = {
        "url": url,
        "final_url": url,
        "title": "Example article",
        "site": "example.org",
        "published": None,
        "fetched_at": datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        "content_sha256": hashlib.sha256(f"{url}\n{text}".encode()).hexdigest(),
        "text": text,
    }
    fields.update(overrides)
    return Page.model_validate(fields)


def make_chunk(
    page: Page | None = None, *, start: int = 0, end: int | None = None, index: int = 0
) -> Chunk:
    """The chunk `page.text[start:end]` of `page` (a default page when None)."""
    page = page or make_page()
    end = len(page.text) if end is None else end
    text = page.text[start:end]
    return Chunk(
        content_sha256=page.content_sha256,
        index=index,
        start=start,
        end=end,
        text=text,
        tokens=count_tokens(text),
    )


def make_scored(
    text: str = "A retrieved passage.",
    *,
    score: float = 0.5,
    url: str = "https://example.org/a",
    page: Page | None = None,
    start: int = 0,
    end: int | None = None,
    tokens: int | None = None,
    vector: Sequence[float] | None = None,
) -> ScoredChunk:
    """A scored chunk of `page` (or of a one-chunk page holding `text` at `url`).

    `vector` defaults to the hash embedding of the chunk's text; `tokens` overrides the count.
    """
    page = page or make_page(url=url, text=text)
    chunk = make_chunk(page, start=start, end=end)
    if tokens is not None:
        chunk = chunk.model_copy(update={"tokens": tokens})
    vec = list(vector) if vector is not None else _EMBEDDER.embed_one(chunk.text)
    return ScoredChunk(chunk=chunk, url=page.url, score=score, vector=vec)


def one_hot(i: int, dimensions: int = 64) -> list[float]:
    """A unit vector along axis `i`: orthogonal to every other axis, so never a duplicate."""
    vec = [0.0] * dimensions
    vec[i] = 1.0
    return vec


def make_bundle_for(ranked: Sequence[ScoredChunk]) -> Bundle:
    """The bundle of chunks made by `make_scored` (each the whole of its own page)."""
    pages = {c.chunk.content_sha256: make_page(url=c.url, text=c.chunk.text) for c in ranked}
    return build_bundle(job_id="job", question="q", queries=[], pages=pages, ranked=ranked,
                        failures=[], stats=BundleStats())  # fmt: skip
