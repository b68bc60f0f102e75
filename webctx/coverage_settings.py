"""The settings of the optional coverage judge (WEBCTX_COVERAGE__<NAME>), a group of the one
Settings (`webctx.settings.Settings.coverage`); the judge is webctx/stages/judge.py."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CoverageSettings(BaseModel):
    """The coverage judge (WEBCTX_COVERAGE__<NAME>), off by default: after the numbers have
    assessed a bundle's coverage, a chat model (the OpenAI-compatible API of `OPENAI_BASE_URL`)
    reads each facet's passages and says whether they answer it; a facet it finds unanswered is
    weak at most (docs/bundle.md). On any error, timeout or malformed answer the numbers stand."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    judge_model: str | None = None
    """The chat model that judges coverage; unset or empty: no judge, nothing is sent."""
    judge_timeout_s: float = Field(default=10.0, gt=0, le=120)
    """How long the judge may take over all of a bundle's facets; past it the numbers stand."""
    judge_passages: int = Field(default=4, ge=1, le=20)
    """Passages of each facet shown to the judge at most (its first, the best ranked)."""
