"""The search provider's copy of a page (Tavily's `raw_content`, Exa's `text`) standing in
for a download that failed for a transport reason: a timeout, no connection, a 5xx, or the
site blocking us (403, 429, a challenge page). Never for a page our own policy refused
(robots.txt, an opt-out, the address guard: BlockedURL), nor for one that answered but
could not be read (too large, unsupported, no text).

The copy is a page of its own: its text (invisible characters stripped as an extraction
strips them) has its own content hash, its chunks are spans of that text and verified
against it like any other, and its source says `retrieved: "provider"`."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from urllib.parse import urlsplit

from webctx.errors import (
    BlockedURL,
    FetchError,
    FetchTimeout,
    HTTPStatusError,
    Interstitial,
)
from webctx.jobs.engine import Engine
from webctx.jobs.freshness import retrieval
from webctx.models import Page, SearchResult
from webctx.stages.fetch import MIN_TEXT_CHARS
from webctx.stages.search import normalize_url
from webctx.stages.visibility import strip_invisible

logger = logging.getLogger(__name__)
BLOCKING_STATUSES = frozenset({403, 429})
"""A site's answers that block the download rather than refuse the page."""


def transport_failure(exc: FetchError) -> bool:
    """True when the download failed for a transport reason (the provider's copy may stand
    in), False when a policy refused the page or it answered unreadable."""
    if isinstance(exc, Interstitial):
        return True
    if isinstance(exc, BlockedURL):  # robots.txt, an opt-out, the address guard
        return False
    if isinstance(exc, FetchTimeout):
        return True
    if isinstance(exc, HTTPStatusError):
        return exc.status >= 500 or exc.status in BLOCKING_STATUSES
    return type(exc) is FetchError  # no connection, no address, a broken answer


def provider_result(engine: Engine, job_id: str, url: str) -> SearchResult | None:
    """The job's search result for `url` that carries the provider's text, if any."""
    key = normalize_url(url)
    for results in engine.jobs.search_results(job_id):
        for result in results:
            if result.content and normalize_url(result.url) == key:
                return result
    return None


def provider_page(result: SearchResult, url: str) -> Page | None:
    """The page a provider's text makes for `url` (its own hash), or None when the result
    carries no usable text."""
    text = strip_invisible((result.content or "").strip())
    if len(text) < MIN_TEXT_CHARS:
        return None
    return Page(url=url, final_url=result.url, title=result.title,
                site=urlsplit(result.url).hostname or "", fetched_at=datetime.now(UTC),
                content_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
                text=text)  # fmt: skip


def provider_copy(
    engine: Engine, job_id: str, url_id: str, url: str, exc: FetchError
) -> Page | None:
    """The provider's copy of `url`, saved for the job as `retrieved: "provider"`, when its
    download failed for a transport reason and a provider returned its text; else None."""
    if not transport_failure(exc):
        return None
    result = provider_result(engine, job_id, url)
    page = provider_page(result, url) if result is not None else None
    if result is None or page is None:
        return None
    engine.jobs.add_counts(job_id, pages_from_provider=1)
    engine.jobs.save_page(job_id, url_id, page, retrieval("provider", page.fetched_at))
    logger.info("provider copy served", extra={"job_id": job_id, "url": url,
                "provider": result.provider, "reason": exc.reason})  # fmt: skip
    return page
