"""The bounds of a `depth=deep` job's further rounds (WEBCTX_DEEP__<NAME>), a group of the
one Settings (`webctx.settings.Settings.deep`); the rounds are webctx/jobs/rounds.py."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DeepSettings(BaseModel):
    """How far a `depth=deep` job goes past its first round (WEBCTX_DEEP__<NAME>). A further
    round starts only while a facet of the question is weak or missing and every bound
    below still holds; the job then ranks what it has."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    max_rounds: int = Field(default=2, ge=0, le=5)
    """Rounds after the first, at most."""
    queries_per_facet: int = Field(default=2, ge=1, le=4)
    """Queries a round sends for each weak or missing facet: the facet alone, then the
    facet with the terms of its best passages."""
    results_per_query: int = Field(default=20, ge=1, le=100)
    """Search results asked of each query of a further round (more than the first round's)."""
    pages_per_round: int = Field(default=6, ge=1, le=50)
    """New pages (search results and same-site links) a further round fetches at most."""
    links_per_round: int = Field(default=2, ge=0, le=20)
    """Of those, same-site links of the best pages at most."""
    max_pages: int = Field(default=12, ge=1, le=200)
    """New pages all further rounds of a job fetch together, at most."""
    max_tokens: int = Field(default=200_000, ge=0)
    """No further round once the job has embedded this many tokens."""
    max_seconds: float = Field(default=30.0, gt=0)
    """No further round once the job is this old (seconds); below the job's deadline."""
