"""Pages rendered by script: whether a page goes to the render queue, and its render.

A page whose static extraction finds no text and that looks like a script-filled shell
(`NeedsRender`, `webctx.stages.shell`), or any page of an "always render" domain, goes to
the `render` queue, where a browser loads it behind the fetch guard
(`webctx.adapters.browser`) and the rendered DOM goes through the same extraction. Its
fetch completes (`FanIn.fetched`) only when the render ends or fails, so the job's
fan-in waits for it like for any other page.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import redis

from webctx.errors import FetchError, NeedsRender
from webctx.jobs.caches import RememberedFailure
from webctx.jobs.engine import Engine
from webctx.jobs.freshness import retrieval
from webctx.jobs.steps import record_failure
from webctx.models import Page
from webctx.stages.fetch import extract_page
from webctx.stages.search import domain_matches

logger = logging.getLogger(__name__)


class ToRender:
    """A fetch's outcome: the page goes to the render queue."""


TO_RENDER = ToRender()


def render_refusal(engine: Engine, url: str) -> str | None:
    """Why `url` cannot go to the render queue, or None when it can."""
    render = engine.settings.render
    if not render.enabled:
        return "rendering is off (WEBCTX_RENDER__ENABLED)"
    if domain_matches(urlsplit(url).hostname or "", render.never_domains):
        return "rendering is off for this domain (WEBCTX_RENDER__NEVER_DOMAINS)"
    if engine.renderer is None and not render.remote:
        return NeedsRender.INSTALL_HINT
    return None


def always_rendered(engine: Engine, url: str) -> bool:
    """True when `url`'s domain is rendered whatever its static extraction gives."""
    domains = engine.settings.render.always_domains
    host = urlsplit(url).hostname or ""
    return domain_matches(host, domains) and render_refusal(engine, url) is None


def render_for_job(engine: Engine, job_id: str, url_id: str, url: str) -> Page | None:
    """The rendered page of `url` (saved in the job store), or None with the failure
    recorded (`needs_render` with an install hint where this process has no browser)."""
    jobs, renderer = engine.jobs, engine.renderer
    try:
        if renderer is None:
            raise NeedsRender(url, f"the page is rendered by script; {NeedsRender.INSTALL_HINT}")
        download = renderer.render(url)
        page = extract_page(download, timeout_s=engine.settings.fetch.extract_timeout_s,
                            rendered=True, html=engine.html)  # fmt: skip
    except FetchError as exc:
        jobs.add_counts(job_id, pages_rendered=1)
        record_failure(engine, job_id, url_id, url, "render", exc)
        engine.page_cache.remember_failure(url, RememberedFailure("render", exc.reason, str(exc)))
        return None
    except redis.RedisError:
        raise  # the job store is down, not the page: redelivered later
    except Exception as exc:  # a bug on an odd page must settle it, not stall the job
        logger.exception("render failed", extra={"job_id": job_id, "url": url})
        record_failure(engine, job_id, url_id, url, "render", exc)
        return None
    jobs.add_counts(job_id, pages_rendered=1)
    jobs.save_page(job_id, url_id, page, retrieval("live", page.fetched_at))
    engine.page_cache.remember(url, page)
    return page
