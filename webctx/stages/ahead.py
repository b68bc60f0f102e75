"""A one-off job's page embedded as it arrives: the chunks the lexical first pass is
likely to select (webctx.stages.prefilter), into the embedding cache, while the job's
other pages download.

The first pass itself needs every page (BM25's document frequencies and its best
`chunks` are over all of them), so rank still selects exactly as before; it finds the
chunks embedded ahead in the cache and embeds only the rest. With the local model the CPU
is mostly idle while pages download, and embedding the selection after the last page
was most of a job's time (issue #22; docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from webctx.models import Chunk, Page
from webctx.net.ratelimit import RedisRateLimiter
from webctx.protocols import Embedder, EmbeddingCache
from webctx.settings import ChunkSettings, EmbedSettings, PrefilterSettings
from webctx.stages.chunk import chunk_page
from webctx.stages.embed import embed_with_cache, parallel_requests
from webctx.stages.prefilter import select_candidates


def likely_selected(
    question: str, chunks: Sequence[Chunk], *, prefilter: PrefilterSettings, sources: int
) -> list[int]:
    """Positions of one page's `chunks` that the job's first pass is likely to select,
    most likely first: the page's own first pass with the job's `chunks` and `neighbours`
    shared out over `sources` pages (its best `per_page` by the page's own BM25 are among
    the first)."""
    share = max(sources, 1)
    lexical = select_candidates(
        question, chunks, limit=-(-prefilter.chunks // share), per_page=prefilter.per_page,
        neighbours=-(-prefilter.neighbours // share),
    )  # fmt: skip
    return sorted(lexical.selected, key=lambda i: (-lexical.scores[i], i))


@dataclass
class AheadOutcome:
    """What embedding one page ahead did: chunks embedded (sent or found in the cache)
    and what that cost."""

    chunks: int = 0
    requests: int = 0
    tokens: int = 0
    cache_hits: int = 0
    tokens_saved: int = 0


def embed_ahead(
    question: str,
    page: Page,
    *,
    embedder: Embedder,
    cache: EmbeddingCache,
    chunking: ChunkSettings,
    embedding: EmbedSettings,
    prefilter: PrefilterSettings,
    sources: int,
    stop: Callable[[], bool],
    limiter: RedisRateLimiter | None = None,
    batch: int | None = 16,
) -> AheadOutcome:
    """Embed the page's `likely_selected` chunks into `cache`, `batch` at a time, most
    likely first, until done or `stop()` says so (checked before each batch: once every
    page is in, rank knows the real selection and takes over). Small batches for a model
    in process: rank waits for the one in flight. `batch=None`: all in one go (an API:
    one request per page, its time is the provider's). One attempt per call: a refusal
    is raised at once, as a retry's backoff would hold rank back (rank embeds the rest)."""
    chunks = chunk_page(page, max_tokens=chunking.max_tokens,
                        overlap_tokens=chunking.overlap_tokens)  # fmt: skip
    texts = [c.text for c in chunks]
    order = likely_selected(question, chunks, prefilter=prefilter, sources=sources)
    done = AheadOutcome()
    step = batch or max(len(order), 1)
    for start in range(0, len(order), step):
        if stop():
            break
        part = [texts[i] for i in order[start : start + step]]
        outcome = embed_with_cache(
            part, embedder, cache=cache, limiter=limiter,
            max_inputs=embedding.max_inputs_per_request,
            max_tokens_per_request=embedding.max_tokens_per_request,
            max_input_tokens=embedding.max_input_tokens, max_attempts=1,
            parallel=parallel_requests(embedder, embedding.parallel_requests),
        )  # fmt: skip
        done.chunks += len(part)
        done.requests += outcome.requests
        done.tokens += outcome.tokens
        done.cache_hits += outcome.cache_hits
        done.tokens_saved += outcome.tokens_saved
    return done
