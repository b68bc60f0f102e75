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
    held: bool = False,
) -> str:
    """Record a job, start its plan task and its deadline watchdog; return the job id.

    `priority` (batch items) is inherited by every task the job's tasks start
    (`task_inherit_parent_priority`), so a worker serves interactive jobs first.
    QuotaExceeded, and nothing started, if the tenant's jobs would hold more than
    `max_stored_bytes` (0: no limit; webctx.jobs.quota). A `held` job (admission) gets its
    watchdog only: the app's `publish_held` sends its plan task once it has a slot.
    """
    job_id = jobs.create(
        request, job_id=job_id, tenant=tenant, batch=batch, max_stored_bytes=max_stored_bytes
    )
    priority = broker_priority(priority)
    if not held:
        app.signature("webctx.plan", args=(job_id,)).apply_async(priority=priority)
    app.signature("webctx.rank", args=(job_id,), kwargs={"force": True}).apply_async(
        countdown=timeout_s, priority=priority
    )
    return job_id


def warm_submission() -> None:
    """Load what a process's first `submit_job` would load (~15 ms alone, ~0.1 s when it
    falls in a running job's first moments on a busy core): the app's tasks, its result
    backend, and a producer connected to the broker, kept in the app's pool. Raises what
    the broker connection raises; a caller warming ahead of any job may ignore it."""
    app.finalize(auto=True)
    _ = app.backend, app.events.Dispatcher  # what `send_task` loads on its first call
    with app.producer_or_acquire() as producer:
        producer.connection.ensure_connection(max_retries=1)
