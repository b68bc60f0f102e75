"""The job engine's collaborators: what a job's tasks work with, built once per process by
the worker layer (`webctx.workers.deps.build_deps`) from Settings.

The vector store opens on first use, so a worker that serves only the search and fetch
queues never opens it (the embedded engine admits one process per path).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from webctx.errors import TransientError, WebctxError
from webctx.jobs.caches import PageCache, SearchCache, StoredPages
from webctx.jobs.counts_ahead import CountsAhead
from webctx.jobs.fanin import FanIn
from webctx.jobs.group_flush import GroupFlush
from webctx.jobs.staging import ChunkStaging
from webctx.jobs.store import JobStore
from webctx.models import Bundle, Page
from webctx.net.breaker import ProviderBreaker
from webctx.net.ratelimit import RedisRateLimiter
from webctx.protocols import (
    ConditionalFetcher,
    Embedder,
    EmbeddingCache,
    GroupFlushable,
    PdfReader,
    Renderer,
    SearchProvider,
    VectorStore,
)
from webctx.settings import Settings
from webctx.stages.plan import QueryPlan

if TYPE_CHECKING:  # the extraction (trafilatura) loads where pages are fetched, not in clients
    from webctx.stages.fetch import HtmlExtractor

logger = logging.getLogger(__name__)

Retry = Callable[[TransientError], None]
"""A task's retry: raises (the task runs again later) while retries remain, returns once
they are spent (the step then records the failure)."""
IndexedCopy = Callable[[str, str, float], tuple[Page, float] | None]
"""The persistent index's copy of a URL for a tenant (tenant, url, max age in seconds) and
when it was last confirmed current (epoch seconds), or None."""
Plan = Callable[[str, int], QueryPlan]
"""A question's plan: at most n search queries, and its facets."""
Judge = Callable[[Bundle], None]
"""Combines a judge's verdicts with a bundle's coverage, in place (`judge_bundle`)."""


@dataclass
class Engine:
    """Everything a job's steps need."""

    settings: Settings
    jobs: JobStore
    fanin: FanIn
    search: SearchProvider
    fetcher: ConditionalFetcher
    embedder: Embedder
    plan: Plan
    page_cache: PageCache
    search_cache: SearchCache
    stored: StoredPages
    """Pages known to be in this store, embedded by this model, chunked this way."""
    staging: ChunkStaging
    """Embedded pages waiting for their store task, in the same store scope."""
    open_store: Callable[[], VectorStore]
    indexed_copy: IndexedCopy
    cache: EmbeddingCache | None = None
    limiter: RedisRateLimiter | None = None
    breakers: tuple[ProviderBreaker, ...] = ()
    """The search and embeddings providers' shared breakers: a job fails at once while one
    of them is open (`webctx.jobs.steps.plan_job`)."""
    renderer: Renderer | None = None
    """The browser of this process (launched on first use); None: none installed."""
    pdf: PdfReader | None = None
    """Reads PDFs (in a sandbox); None: PDFs fail `unsupported_content`."""
    html: HtmlExtractor | None = None
    """Extracts HTML pages in child processes when one is idle (the local service)."""
    judge: Judge | None = None
    """The coverage judge (WEBCTX_COVERAGE__JUDGE_MODEL); None: the numbers alone."""
    counts_ahead: CountsAhead = field(default_factory=CountsAhead)
    """The BM25 term counts of jobs' chunks, counted as their pages were embedded here."""
    _store: VectorStore | None = None
    _store_lock: threading.Lock = field(default_factory=threading.Lock)
    _group_flush: GroupFlush | None = None

    @property
    def store(self) -> VectorStore:
        """The vector store, opened on first use. Opened empty, it voids the marks of pages
        stored before (`StoredPages.forget_store`): trusting them would skip embedding
        pages the store no longer holds, and rank would find nothing of them."""
        with self._store_lock:
            if self._store is None:
                store = self.open_store()
                try:
                    empty = store.count() == 0
                except WebctxError as exc:  # a server down now: its tasks will say so
                    logger.warning("vector store not counted", extra={"exc": str(exc)})
                    empty = False
                if empty:
                    self.stored.forget_store()
                if isinstance(store, GroupFlushable):
                    self._group_flush = GroupFlush(store)
                self._store = store
            return self._store

    def after_durable(self, then: Callable[[], None]) -> bool:
        """Have `then` run once the store's writes so far are durable, after the next group
        flush (webctx/jobs/group_flush.py); False, and nothing done, for a store whose each
        write is durable on return (the caller runs `then` itself)."""
        flusher = self._group_flush
        if flusher is None:
            return False
        flusher.after_flush(then)
        return True

    @property
    def defers_flush(self) -> bool:
        """True when the store's writes are made durable by a group flush."""
        _ = self.store
        return self._group_flush is not None

    def flush_writes(self) -> None:
        """Make the store's pending writes durable now, and run what waited for that (a
        worker shutting down)."""
        flusher = self._group_flush
        if flusher is not None:
            flusher.flush_now()

    def close_store(self) -> None:
        """Close the vector store if it was opened (the embedded engine holds a lock),
        after the group flush of its pending writes."""
        with self._store_lock:
            flusher, self._group_flush = self._group_flush, None
            if flusher is not None:
                flusher.close()
            close = getattr(self._store, "close", None)
            if callable(close):
                close()
            self._store = None


def store_scope(settings: Settings, model: str) -> tuple[str, ...]:
    """What a stored page's points depend on: store, collection, model, chunking."""
    return (
        settings.qdrant_url or str(settings.qdrant_path.resolve()),
        settings.qdrant_collection,
        model,
        f"{settings.chunk.max_tokens}/{settings.chunk.overlap_tokens}",
    )
