"""The freshness contract of a job: how old a stored copy of a page it may use instead of
downloading it, and whether an older copy may stand in when the download fails.

A request's `max_age` (seconds; None: the page-cache window) is capped by the configured
windows: the shared page cache's (WEBCTX_PAGE_CACHE_TTL_S) and the persistent index's
(WEBCTX_INDEX__MAX_AGE_S). A copy confirmed current since the job was created is never
too old, whatever `max_age` says: with `max_age=0` the items of a batch still share one
download made after they started, and never a copy older than the job. `max_age=-1` is
the opposite end: stored copies only, of any age the stores still hold, and no download.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from webctx.models import JobRequest, Retrieval, Retrieved


@dataclass(frozen=True)
class Freshness:
    """What one job accepts instead of a download."""

    cache_max_age_s: float
    """A page-cache copy confirmed current this recently is used (0: none older than the job)."""
    index_max_age_s: float
    """An index copy confirmed current this recently is used (0: none older than the job)."""
    not_before: float
    """The job's creation (epoch seconds): a copy confirmed since is always current enough."""
    stale_if_error: bool = False
    """A failed download falls back to the newest stored copy, of any age."""
    cache_only: bool = False
    """Never download: a page without a stored copy fails (`max_age=-1`)."""

    def accepts(self, checked_at: float, *, window_s: float, now: float) -> bool:
        """True if a copy confirmed current at `checked_at` is fresh enough for the job."""
        return checked_at >= self.not_before or now - checked_at < window_s


def freshness_for(
    request: JobRequest,
    *,
    created_at: float,
    cache_ttl_s: float,
    index_max_age_s: float,
    cache_by_default: bool = True,
) -> Freshness:
    """The job's contract: its request's `max_age` under the configured windows. Without
    one, the windows themselves, except the page cache's for a job that does not read the
    caches by default (`cache_by_default` False: it downloads anew)."""
    cache_s = max(0.0, cache_ttl_s)
    index_s = max(0.0, index_max_age_s)
    if request.max_age == -1:  # any age; a store switched off (0) still holds nothing
        return Freshness(
            cache_max_age_s=math.inf if cache_s else 0.0,
            index_max_age_s=math.inf if index_s else 0.0,
            not_before=created_at,
            stale_if_error=request.stale_if_error,
            cache_only=True,
        )
    if request.max_age is None:
        cache_wanted, index_wanted = (cache_s if cache_by_default else 0.0), index_s
    else:
        cache_wanted = index_wanted = float(request.max_age)
    return Freshness(
        cache_max_age_s=min(cache_wanted, cache_s),
        index_max_age_s=min(index_wanted, index_s),
        not_before=created_at,
        stale_if_error=request.stale_if_error,
    )


def retrieval(
    retrieved: Retrieved, checked_at: float | datetime, *, stale_reason: str | None = None
) -> Retrieval:
    """How a job got a page: `checked_at` is when its text was last confirmed current."""
    when = (
        checked_at
        if isinstance(checked_at, datetime)
        else datetime.fromtimestamp(checked_at, tz=UTC)
    )
    return Retrieval(retrieved=retrieved, checked_at=when, stale=stale_reason is not None,
                     stale_reason=stale_reason)  # fmt: skip
