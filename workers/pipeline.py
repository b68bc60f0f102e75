"""How a job starts: its record, its plan task and its deadline watchdog. The stages after
plan are started by the job engine's fan-in (`webctx.jobs.fanin`, through the app's
`start_tasks`).

Only store and rank open the vector store; every other stage runs on any worker, so with
the embedded engine (one process) the CPU and waiting of embedding scale with workers. A
watchdog `rank(force=True)` is scheduled at submission, so a job whose messages were lost
still ends by its deadline.
"""

from __future__ import annotations

from webctx.jobs.store import JobStore
from webctx.models import JobRequest
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
    max_stored_bytes: int = 0,
) -> str:
    """Record a job, start its plan task and its deadline watchdog; return the job id.

    `priority` (batch items) is inherited by every task the job's tasks start
    (`task_inherit_parent_priority`), so a worker serves interactive jobs first.
    QuotaExceeded, and nothing started, if the tenant's jobs would hold more than
    `max_stored_bytes` (0: no limit; webctx.jobs.quota).
    """
    job_id = jobs.create(
        request, job_id=job_id, tenant=tenant, batch=batch, max_stored_bytes=max_stored_bytes
    )
    priority = broker_priority(priority)
    app.signature("webctx.plan", args=(job_id,)).apply_async(priority=priority)
    app.signature("webctx.rank", args=(job_id,), kwargs={"force": True}).apply_async(
        countdown=timeout_s, priority=priority
    )
    return job_id
