"""How a job fans out across the stage queues.

plan ─► search × queries ─► (last search) select URLs ─► fetch × URLs ─► embed × pages
     ─► store × pages ─► (last page settled) rank ─► bundle
  └──► embed_question (the question's vector into the embedding cache, ahead of rank)

Only store and rank open the vector store; every other stage runs on any worker, so with
the embedded engine (one process) the CPU and waiting of embedding scale with workers.

No chords (TRAPS 4): each fan-in is a completion set in the job store, and the task
whose completion fills it enqueues the next stage. A watchdog `rank(force=True)` is
scheduled at submission, so a job whose messages were lost still ends by its deadline.
"""

from __future__ import annotations

from collections.abc import Sequence

from celery import group

from webctx.jobs.store import JobStore
from webctx.models import Failure, JobRequest, JobStatus
from webctx.stages.search import merge_results
from webctx.workers.app import app, broker_priority


def submit_job(
    jobs: JobStore,
    request: JobRequest,
    *,
    timeout_s: float,
    job_id: str | None = None,
    tenant: str | None = None,
    batch: str | None = None,
    priority: int | None = None,
) -> str:
    """Record a job, start its plan task and its deadline watchdog; return the job id.

    `priority` (batch items) is inherited by every task the job's tasks start
    (`task_inherit_parent_priority`), so a worker serves interactive jobs first.
    """
    job_id = jobs.create(request, job_id=job_id, tenant=tenant, batch=batch)
    priority = broker_priority(priority)
    app.signature("webctx.plan", args=(job_id,)).apply_async(priority=priority)
    app.signature("webctx.rank", args=(job_id,), kwargs={"force": True}).apply_async(
        countdown=timeout_s, priority=priority
    )
    return job_id


def start_searches(job_id: str, count: int) -> None:
    """One search task per planned query, in parallel."""
    group(app.signature("webctx.search", args=(job_id, i)) for i in range(count)).apply_async()


def start_fetches(jobs: JobStore, job_id: str) -> None:
    """Merge every query's results, keep the best `max_sources`, fetch each."""
    request = jobs.request(job_id)
    merged = merge_results(
        jobs.search_results(job_id),
        include_domains=request.include_domains,
        exclude_domains=request.exclude_domains,
    )
    chosen = [r.url for r in merged[: request.max_sources]]
    if not chosen:
        jobs.set_status(job_id, JobStatus.FAILED, error=_no_results_error(jobs.failures(job_id)))
        return
    url_ids = jobs.set_urls(job_id, chosen)
    jobs.set_count(job_id, "results", len(merged))
    group(app.signature("webctx.fetch", args=(job_id, uid)) for uid in url_ids).apply_async()
    jobs.mark_next_started(job_id, "search")


def start_embed(job_id: str, url_id: str) -> None:
    """Chunk and embed one fetched page."""
    app.signature("webctx.embed", args=(job_id, url_id)).apply_async()


def start_store(job_id: str, url_id: str) -> None:
    """Write one embedded page's staged chunks to the vector store."""
    app.signature("webctx.store", args=(job_id, url_id)).apply_async()


def start_question_embedding(job_id: str) -> None:
    """Embed the question ahead of ranking (into the embedding cache)."""
    app.signature("webctx.embed_question", args=(job_id,)).apply_async()


def start_rank(jobs: JobStore, job_id: str) -> None:
    """Rank once every chosen URL is settled (embedded or failed)."""
    app.signature("webctx.rank", args=(job_id,)).apply_async()
    jobs.mark_next_started(job_id, "embed")


def _no_results_error(failures: Sequence[Failure]) -> str:
    if failures:
        reasons = "; ".join(f"{f.url}: {f.error}" for f in failures[:5])
        return f"search failed for every query: {reasons}"
    return "search returned no results"
