"""One Settings object, read from the environment. Only entry points call `get_settings()`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


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
    user_agent: str = "webctx/0.1 (+https://github.com/webctx/webctx; research bot)"


class ChunkSettings(BaseModel):
    """Chunking targets in tokens (WEBCTX_CHUNK__<NAME>)."""

    max_tokens: int = 256
    overlap_tokens: int = 32


class EmbedSettings(BaseModel):
    """Request packing and retries of the embedder (WEBCTX_EMBED__<NAME>)."""

    max_inputs_per_request: int = 256
    max_tokens_per_request: int = 100_000
    max_input_tokens: int = 8000
    max_attempts: int = 6
    timeout_s: float = 60.0


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
    embedding_provider: Literal["auto", "openai", "hash"] = "auto"
    """auto: the OpenAI-compatible API when OPENAI_BASE_URL or OPENAI_API_KEY is set."""
    embedding_model: str = "text-embedding-3-small"
    embedding_dimensions: int | None = None
    planner_model: str | None = None

    qdrant_url: str | None = None
    qdrant_api_key: SecretStr | None = None
    qdrant_path: Path = Path(".webctx/qdrant")
    qdrant_collection: str = "webctx_chunks"

    allow_private_networks: bool = False
    allowed_networks: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """CIDRs allowed even though private, e.g. 127.0.0.1/32 (comma-separated in env)."""
    job_ttl_s: int = 7 * 24 * 3600
    job_timeout_s: float = 600.0
    worker_concurrency: int = 8

    fetch: FetchSettings = FetchSettings()
    chunk: ChunkSettings = ChunkSettings()
    embed: EmbedSettings = EmbedSettings()

    @field_validator("allowed_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: run everything in this process."""
        return not self.broker_url

    def state_url(self) -> str | None:
        """Redis URL of the job state store, or None for the in-process store."""
        if self.redis_url:
            return self.redis_url
        if self.broker_url and self.broker_url.startswith(("redis://", "rediss://")):
            return self.broker_url
        return None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (entry points only)."""
    return Settings()
