"""One Settings object, read from the environment. Only entry points call `get_settings()`."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

import platformdirs
from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from webctx.protocols import VectorDatatype


class FetchSettings(BaseModel):
    """Limits of the page fetcher (WEBCTX_FETCH__<NAME>)."""

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    total_timeout_s: float = 20.0
    max_bytes: int = 5_000_000
    max_redirects: int = 5
    per_host_concurrency: int = 2
    concurrency: int = 8
    extract_timeout_s: float = 15.0
    product_token: str = Field(default="webctx", pattern=r"^[A-Za-z_-]+$")
    """The name robots.txt groups (`User-agent: webctx`), `X-Robots-Tag: webctx: ...` and
    `<meta name="webctx">` are matched against, case-insensitively and whole."""
    user_agent: str = "webctx/0.1 (+https://github.com/webctx/webctx; research bot)"
    """Sent on every request (pages, robots.txt, tdmrep.json, sitemaps, feeds,
    revalidations, the browser); must contain `product_token` as a product name."""
    allowed_ports: list[int] = Field(default_factory=lambda: [80, 443])
    """Ports fetchable anywhere; other ports only inside WEBCTX_ALLOWED_NETWORKS."""
    respect_robots: bool = True
    robots_ttl_s: float = 3600.0
    """robots.txt and tdmrep.json answers are kept this long per origin."""
    opt_outs: Literal["honour", "report"] = "honour"
    """Publishers' opt-outs beyond robots.txt (X-Robots-Tag and meta `noai`/`none`, a TDM
    reservation): honour (the page fails `opted_out`, its text is not kept) or report
    (used, its bundle source marked `opt_out`; for operators with a licence)."""
    per_host_delay_s: float = 1.0
    """Minimum gap between request starts to one host (robots.txt Crawl-delay may raise it)."""
    max_backoff_s: float = 300.0
    """Longest pause of a host after it answered 429/503."""
    pdf_max_bytes: int = 20_000_000
    """A PDF body may be this large (other bodies: `max_bytes`)."""
    pdf_max_pages: int = 300
    """A PDF with more pages is refused (`too_many_pages`) before any page is read."""
    pdf_cpu_s: float = 15.0
    """CPU seconds of the child process that reads one PDF (RLIMIT_CPU; `timeout`)."""
    pdf_memory_mb: int = 256
    """Address space of that child (RLIMIT_AS), in MiB; past it the PDF is `too_large`."""
    pdf_timeout_s: float = 20.0
    """Wall-clock deadline of that child; it is killed past it (`timeout`)."""

    @model_validator(mode="after")
    def _agent_names_token(self) -> FetchSettings:
        """A User-Agent that does not carry the product token would be matched under one
        name and seen by sites under another: refused, not patched."""
        if not agent_has_token(self.user_agent, self.product_token):
            raise ValueError(
                f"WEBCTX_FETCH__USER_AGENT {self.user_agent!r} does not contain the product "
                f"token {self.product_token!r} (WEBCTX_FETCH__PRODUCT_TOKEN) as a product "
                f"name, e.g. {self.product_token}/1.0: robots.txt rules for it would not "
                "apply to what sites see; put it in the User-Agent or set the token"
            )
        return self


def agent_has_token(user_agent: str, token: str) -> bool:
    """True if `token` stands in `user_agent` as a whole product name (`webctx/0.1`,
    `(compatible; webctx/0.1)`), compared case-insensitively."""
    pattern = rf"(?<![A-Za-z0-9_-]){re.escape(token)}(?![A-Za-z0-9_-])"
    return re.search(pattern, user_agent, re.IGNORECASE) is not None


class RenderSettings(BaseModel):
    """Pages rendered by script: headless Chromium behind the fetch guard
    (WEBCTX_RENDER__<NAME>, docs/security.md)."""

    enabled: bool = True
    """False: a page that needs a browser fails `needs_render` (no render queue)."""
    browser: str = ""
    """Chromium's executable; empty: the first of chromium, chromium-browser, google-chrome
    on PATH. Never downloaded."""
    remote: bool = False
    """Divert to the render queue even when this process has no browser (a render worker
    elsewhere has one): set on fetch workers of a deployment with a render role."""
    always_domains: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Rendered without trying the static fetch first (subdomains included)."""
    never_domains: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Never rendered: their shells fail `needs_render`."""
    page_timeout_s: float = Field(default=20.0, gt=0)
    """The whole render of one page: navigation, scripts, settling, reading the DOM."""
    settle_ms: int = Field(default=500, ge=0)
    """Quiet time after the load event, for scripts that fill the page late."""
    max_page_bytes: int = Field(default=20_000_000, ge=100_000)
    """Bytes of all responses one page may load; further requests are refused."""
    js_heap_mb: int = Field(default=256, ge=32)
    """V8 heap cap of each renderer process (--max-old-space-size)."""
    memory_mb: int = Field(default=1024, ge=128)
    """The browser's processes together (RSS) above this: restarted after the page."""
    concurrency: int = Field(default=2, ge=1)
    """Pages one browser renders at once (each in its own context)."""

    @field_validator("always_domains", "never_domains", mode="before")
    @classmethod
    def _split_domains(cls, value: object) -> object:
        """ "a.org, b.org" or a JSON list; lower-cased."""
        if isinstance(value, str):
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else text.split(",")
        if isinstance(value, list):
            return [str(part).strip().lower() for part in value if str(part).strip()]
        return value


class ChunkSettings(BaseModel):
    """Chunking targets in tokens (WEBCTX_CHUNK__<NAME>)."""

    # Small chunks: a bundle of a few hundred tokens then holds several passages, not one
    # or two pages' worth (bench/answer_recall.py, docs/benchmarks.md).
    max_tokens: int = 64
    overlap_tokens: int = 0


class EmbedSettings(BaseModel):
    """Request packing and retries of the embedder (WEBCTX_EMBED__<NAME>)."""

    max_inputs_per_request: int = 256
    max_tokens_per_request: int = 100_000
    max_input_tokens: int = 8000
    max_attempts: int = 6
    timeout_s: float = 60.0
    rpm: int | None = None
    """Requests per minute of the key, shared by all workers; None: learned from headers."""
    tpm: int | None = None
    """Tokens per minute of the key, shared by all workers; None: learned from headers."""
    cache_ttl_s: int = 30 * 24 * 3600
    """Cached vectors expire this long after their last use."""
    local_backend: Literal["auto", "torch", "onnx", "onnx-int8"] = "auto"
    """How the local model runs. auto: ONNX Runtime fp32 when onnxruntime is installed
    (torch's vectors exactly, 1.7x as fast, docs/benchmarks.md), else torch. onnx-int8 is
    faster still (2.5x) but its answer recall was 0.01 lower at 250 and 500 tokens."""
    local_cache_dir: Path | None = None
    """Where the ONNX export is cached; None: the user cache dir (platformdirs)."""
    local_threads: int | None = Field(default=None, ge=1)
    """ONNX Runtime threads per embedder; None: the cores this process may use."""


class BatchSettings(BaseModel):
    """Batches of questions (WEBCTX_BATCH__<NAME>); see docs/batch.md."""

    concurrency: int = Field(default=4, ge=1)
    """Items of one batch in flight at most."""
    max_inflight: int = Field(default=16, ge=1)
    """Batch items in flight across all batches; split evenly between tenants with batches."""
    priority: int = Field(default=9, ge=0, le=9)
    """Broker priority of batch items' tasks (Redis: 0 is served first; interactive jobs: 0)."""
    tick_s: float = Field(default=5.0, gt=0)
    """A running batch's feeder runs at least this often (besides on each item's end)."""
    price_per_1k_tokens: float = Field(default=0.00002, ge=0)
    """Embedding price for the cost estimate (text-embedding-3-small: $0.02 per 1M tokens)."""
    max_body_bytes: int = Field(default=50_000_000, ge=1_000)
    """A `POST /v1/batches` body over this is refused with 413 while it is read."""


class IndexSettings(BaseModel):
    """The persistent index and its scheduled re-indexing (WEBCTX_INDEX__<NAME>)."""

    max_age_s: float = 24 * 3600.0
    """Research jobs reuse an indexed page younger than this instead of fetching it."""
    gone_after: int = 2
    """A page answering 404/410 on this many consecutive runs is removed."""
    tick_s: float = 30.0
    """How often Celery beat looks for due sources."""
    grace_s: float = 30.0
    """Old chunks of a replaced or removed page are deleted this long after the switch,
    so a search that read the previous page set still finds them."""
    concurrency: int = 8
    """Pages of one source re-indexed in parallel."""
    max_pages: int = 5000
    """Pages taken from one sitemap or feed at most."""


class Settings(BaseSettings):
    """Every knob of webctx; see docs/configuration.md."""

    model_config = SettingsConfigDict(
        env_prefix="WEBCTX_", env_nested_delimiter="__", extra="ignore", populate_by_name=True
    )

    broker_url: str | None = Field(
        default=None, validation_alias=AliasChoices("CELERY_BROKER_URL", "WEBCTX_BROKER_URL")
    )
    result_backend: str | None = Field(
        default=None,
        validation_alias=AliasChoices("CELERY_RESULT_BACKEND", "WEBCTX_RESULT_BACKEND"),
    )
    redis_url: str | None = None
    """Job state store; defaults to the broker URL when that is Redis."""

    search_provider: Literal["ddgs", "searxng"] = "ddgs"
    searxng_url: str | None = None
    search_results_per_query: int = 10

    openai_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_BASE_URL", "WEBCTX_OPENAI_BASE_URL")
    )
    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_API_KEY", "WEBCTX_OPENAI_API_KEY")
    )
    embedding_provider: Literal["auto", "openai", "local", "hash"] = "auto"
    """auto: the OpenAI-compatible API when OPENAI_BASE_URL or OPENAI_API_KEY is set, else
    the local model when the webctx[local] extra is installed."""
    embedding_model: str = "text-embedding-3-small"
    embedding_dimensions: int | None = None
    embed_rpm: int | None = None
    """WEBCTX_EMBED_RPM, as the issue names it; fills `embed.rpm` when that is unset."""
    embed_tpm: int | None = None
    """WEBCTX_EMBED_TPM; fills `embed.tpm` when that is unset."""
    planner_model: str | None = None

    qdrant_url: str | None = None
    qdrant_api_key: SecretStr | None = None
    data_dir: Path = Field(default_factory=lambda: Path(platformdirs.user_data_dir("webctx")))
    """The embedded default's state: its vector store and its Valkey server's files.
    Never the working folder, so a client started anywhere writes nothing there."""
    qdrant_path: Path = Path()
    """Unset: `<data_dir>/qdrant`."""
    qdrant_collection: str = "webctx_chunks"
    qdrant_vector_datatype: VectorDatatype = "float16"
    """How new collections and shards store dense vectors: float16 takes half the memory
    and disk of float32, with the same answer recall (docs/benchmarks.md). One that exists
    keeps the type it was created with."""

    allow_private_networks: bool = False
    allowed_networks: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """CIDRs allowed even though private, e.g. 127.0.0.1/32 (comma-separated in env)."""
    job_ttl_s: int = 7 * 24 * 3600
    job_timeout_s: float = 600.0
    worker_concurrency: int = 8
    service_idle_s: float = Field(default=600.0, ge=0)
    """The local service (no CELERY_BROKER_URL) exits after this many seconds with no task
    running, no message queued and no client request (0: it runs until stopped)."""
    visibility_timeout_s: int = 1800
    """Redis broker: an unacked task is redelivered after this, even while it still runs:
    keep it above the task time limit."""
    worker_lost_after_s: int = Field(default=30, ge=0)
    """Redis broker: a worker silent this long is taken for dead and its unacked tasks are
    requeued by a live worker (0: only the visibility timeout brings them back)."""
    task_time_limit_s: int = 600
    """Hard limit of one task; must stay below the visibility timeout."""
    max_deliveries: int = 3
    """Deliveries of one item that died with its worker before it is failed `worker_lost`."""
    task_max_retries: int = Field(default=5, ge=0)
    """Retries of a task after a transient failure (429, 5xx, timeout) before its item fails."""
    task_retry_backoff_s: float = Field(default=2.0, gt=0)
    """First retry's wait when the provider gave no retry-after; doubles per retry."""
    task_retry_backoff_max_s: float = Field(default=60.0, gt=0)
    """Longest wait before a retry, a provider's retry-after included."""

    page_cache_ttl_s: int = 24 * 3600
    """A URL fetched this recently is reused by any job instead of downloaded (0: off)."""
    search_cache_ttl_s: int = 3600
    """A search query's results are reused for this long (0: off)."""

    log_format: Literal["text", "json"] = "text"
    """Workers (and the API) log JSON lines with job_id/task_id when `json`."""
    log_level: str = "INFO"
    metrics_port: int | None = None
    """A worker serves Prometheus metrics on this port (unset: none)."""
    metrics_host: str = "0.0.0.0"
    otel: bool = False
    """Trace jobs across tasks with OpenTelemetry (needs the `otel` extra)."""

    api_host: str = "127.0.0.1"
    """Address `webctx api` binds (and the ASGI factory assumes) for the auth switch."""
    api_auth: Literal["required", "disabled"] = "required"
    """disabled: no API keys, every caller is `local_tenant`; refused on a non-loopback host."""
    local_tenant: str = "local"
    api_rate_limit_per_minute: int = Field(default=120, ge=1)
    api_context_timeout_s: float = Field(default=120.0, gt=0)
    api_max_body_bytes: int = Field(default=1_000_000, ge=1_000)
    """A request body over this is refused with 413 while it is read (chunked ones too);
    `POST /v1/batches` has `batch.max_body_bytes` instead."""
    tenant_max_stored_bytes: int = Field(default=256_000_000, ge=0)
    """Bytes one tenant's live jobs may keep in the state Redis (requests and bundles, for
    `job_ttl_s`): a job submitted past it (`POST /v1/jobs`, `/v1/context`, MCP web_context) is
    refused with 403 (0: no limit). Batch items count but are never refused."""
    api_max_domains: int = Field(default=100, ge=1)
    """Entries of a job's `include_domains` / `exclude_domains` at most (422 beyond)."""
    api_max_domain_chars: int = Field(default=253, ge=1)
    """Characters of one such entry at most (a DNS name has at most 253; 422 beyond)."""
    mcp_wait_s: float = Field(default=50.0, ge=0)
    """How long an MCP web_context or get_job call waits before it returns the running job:
    under the 60 s request timeout of the TypeScript SDK's clients."""

    fetch: FetchSettings = FetchSettings()
    render: RenderSettings = RenderSettings()
    chunk: ChunkSettings = ChunkSettings()
    embed: EmbedSettings = EmbedSettings()
    index: IndexSettings = IndexSettings()
    batch: BatchSettings = BatchSettings()

    @field_validator("allowed_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _embed_limits(self) -> Settings:
        if self.embed.rpm is None and self.embed_rpm is not None:
            self.embed.rpm = self.embed_rpm
        if self.embed.tpm is None and self.embed_tpm is not None:
            self.embed.tpm = self.embed_tpm
        return self

    @model_validator(mode="after")
    def _state_paths(self) -> Settings:
        if "qdrant_path" not in self.model_fields_set:
            self.qdrant_path = self.data_dir / "qdrant"
            self.model_fields_set.discard("qdrant_path")  # still the default, not the user's
        return self

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: clients use the data directory's local
        service (webctx/workers/service.py), started on demand."""
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
