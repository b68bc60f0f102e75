"""The settings of the providers' shared breaker (WEBCTX_BREAKER__<NAME>), a group of the
one Settings (`webctx.settings.Settings.breaker`); the breaker is webctx/net/breaker.py."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BreakerSettings(BaseModel):
    """When a search or embeddings provider counts as down (WEBCTX_BREAKER__<NAME>): then every
    job that needs it fails at once, with one line naming the provider, its URL and the fix,
    in every process that shares the job store, until a probe finds it answering."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    outage_s: float = Field(default=5.0, gt=0)
    """A provider that failed every request for this long (connections refused, timeouts, 5xx;
    no answer in between, from any worker) is down. Retries of a provider's failures stop by
    then, whatever their count and backoff."""
    rate_limit_budget_s: float = Field(default=15.0, gt=0)
    """429s are pacing (`retry-after` is honoured, by every worker at once); 429s with no answer
    in between for this long, or one asking for a longer wait, make the provider down too."""
    cooldown_s: float = Field(default=5.0, gt=0)
    """A provider found down is not called for this long; then one request probes it (the others
    wait for its answer): an answer closes the breaker, a failure opens it again."""
