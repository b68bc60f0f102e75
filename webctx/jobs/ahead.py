"""A first-pass job's pages embedded as they arrive (`webctx.stages.ahead`): which pages
are, when it stops, and one page at a time per process with an in-process model.

A fetched page of a first-pass job goes to the embed queue while other pages of its job
are still downloading; there its likely chunks go into the embedding cache until every
page is in, then the page is settled and the last settled page starts rank, which finds
them in the cache. Best effort: a failure here costs rank the embedding, nothing else.
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager, nullcontext

import redis

from webctx.errors import ProviderDown
from webctx.jobs.engine import Engine
from webctx.jobs.steps import provider_down
from webctx.models import Page
from webctx.stages.ahead import embed_ahead

logger = logging.getLogger(__name__)

# The local model spreads one call over every core: pages embedded side by side would
# only contend for them (and for the pages still being extracted).
_IN_PROCESS = threading.Lock()


def all_fetched(engine: Engine, job_id: str) -> bool:
    """True once every chosen URL of the job has its fetch complete."""
    jobs = engine.jobs
    return jobs.done_count(job_id, "fetch") >= len(jobs.urls(job_id))


def ahead_wanted(engine: Engine, job_id: str) -> bool:
    """True when a fetched page of a first-pass job is worth embedding ahead of rank: the
    setting is on, the embedding cache is there (rank finds the vectors in it), and some
    of the job's pages are still downloading (else rank knows the real selection now)."""
    on = engine.settings.prefilter.ahead and engine.cache is not None
    return on and not all_fetched(engine, job_id)


def embed_page_ahead(engine: Engine, job_id: str, page: Page) -> None:
    """Embed the page's likely chunks into the embedding cache until every page of the
    job is in, and count them (`embedded_ahead`) and what they cost."""
    jobs, settings, cache = engine.jobs, engine.settings, engine.cache
    if cache is None:
        return
    local = getattr(engine.embedder, "in_process", False)
    turn: AbstractContextManager[object] = _IN_PROCESS if local else nullcontext()

    def stop() -> bool:
        return all_fetched(engine, job_id) or not jobs.is_active(job_id)

    try:
        with turn:
            outcome = embed_ahead(
                jobs.request(job_id).question, page, embedder=engine.embedder, cache=cache,
                chunking=settings.chunk, embedding=settings.embed, prefilter=settings.prefilter,
                sources=len(jobs.urls(job_id)), stop=stop, limiter=engine.limiter,
                batch=16 if local else None,
            )  # fmt: skip
    except redis.RedisError:
        raise  # the job store is down, not the page: redelivered once Redis is back
    except ProviderDown as exc:  # rank would meet it too: the job fails now
        provider_down(engine, job_id, exc)
        return
    except Exception as exc:  # noqa: BLE001 - best effort: rank embeds what is missing
        logger.info("page not embedded ahead", extra={"job_id": job_id, "url": page.url,
                                                       "error": str(exc)})  # fmt: skip
        return
    # Its cache hits are not counted here: rank counts the selected ones as its hits.
    jobs.add_counts(job_id, embedded_ahead=outcome.chunks, embed_requests=outcome.requests,
                    tokens_embedded=outcome.tokens)  # fmt: skip
