"""The runtime of an API, MCP or CLI process, its callers, and job submission: what the
HTTP API, the MCP server and `webctx research` share, without the web framework (a CLI
call imports this on every question; FastAPI alone costs it ~60-90 ms).

`Runtime` holds the job store and the key store of one process. In broker mode they are
the broker's Redis and workers run elsewhere; with no broker (`CELERY_BROKER_URL` unset)
they are the Valkey of the data directory's local service, whose workers run the jobs:
the runtime starts it again if it stopped (idle, or killed) whenever a job is submitted
or waited on.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from webctx.api.limits import check_request_limits
from webctx.errors import (
    ConfigError,
    Conflict,
    InvalidRequest,
    JobNotFound,
    QuotaExceeded,
    TooManyJobs,
    TooManyRequests,
    Unauthorized,
)
from webctx.jobs.admission import Slot, admission_caps
from webctx.jobs.store import JobProgress, JobStore
from webctx.jobs.tenants import TenantStore
from webctx.models import JobRequest, JobStatus
from webctx.settings import Settings
from webctx.workers.deps import StateStores

logger = logging.getLogger(__name__)


@dataclass
class Runtime:
    """The state one API or MCP process works with: its key owners on the state Redis."""

    settings: Settings
    stores: StateStores

    @property
    def jobs(self) -> JobStore:
        """The job store."""
        return self.stores.jobs

    @property
    def tenants(self) -> TenantStore:
        """API keys and their request rates."""
        return self.stores.tenants

    @property
    def auth_required(self) -> bool:
        """True unless WEBCTX_API_AUTH=disabled."""
        return self.settings.api_auth == "required"

    def warm(self) -> None:
        """Load the job-submission path on a background thread, so that the first job's
        submission does not load it inside that job's first moments (`warm_submission`).
        Best effort: a broker not answering yet leaves it to the first submission."""
        threading.Thread(target=_warm_submission, name="webctx-warm-submit", daemon=True).start()

    def keep_service(self) -> None:
        """With no broker: make sure the local service runs (and reset its idle clock)."""
        if self.settings.embedded:
            from webctx.workers.service_client import ensure_service

            ensure_service(self.settings.data_dir)


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: its tenant, and its key id (None without keys)."""

    tenant: str
    key_id: str | None = None


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_auth_setting(settings: Settings, host: str) -> None:
    """Refuse WEBCTX_API_AUTH=disabled on anything but a loopback address."""
    if settings.api_auth == "disabled" and not is_loopback(host):
        raise ConfigError(
            f"WEBCTX_API_AUTH=disabled is for local use: refused on non-loopback host {host!r}"
        )


def _warm_submission() -> None:
    from webctx.workers.pipeline import warm_submission

    try:
        warm_submission()
    except Exception as exc:  # noqa: BLE001 - best effort: the first submission loads it
        logger.info("job submission not warmed ahead", extra={"error": repr(exc)})


@contextmanager
def open_runtime(settings: Settings) -> Iterator[Runtime]:
    """The runtime for `settings`: its stores on the broker's Redis, or with no broker
    on the local service's Valkey (the service started if none runs)."""
    from webctx.workers.app import job_observers, publish_held
    from webctx.workers.deps import state_stores

    # The API's job store tells the same observers as a worker's: the metrics it serves,
    # and the batch feeder when a cancel ends a batch item's job; a cancel that frees a
    # slot sends the tenant's next held job.
    stores = state_stores(settings, observers=job_observers(), publish=publish_held)
    try:
        yield Runtime(settings, stores)
    finally:
        stores.close()


def authenticate(runtime: Runtime, authorization: str | None) -> Caller:
    """The caller behind an `Authorization: Bearer` header, rate-limited per key."""
    if not runtime.auth_required:
        return Caller(tenant=runtime.settings.local_tenant)
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    record = runtime.tenants.resolve(token.strip())
    if record is None:
        raise Unauthorized("invalid or revoked API key")
    limit = record.rate_limit or runtime.settings.api_rate_limit_per_minute
    decision = runtime.tenants.hit(record.key_id, limit=limit)
    if not decision.allowed:
        raise TooManyRequests(
            f"rate limit of {limit} requests per minute exceeded",
            retry_after_s=decision.retry_after_s,
        )
    return Caller(tenant=record.tenant, key_id=record.key_id)


def owned_progress(runtime: Runtime, caller: Caller, job_id: str) -> JobProgress:
    """The job's progress if `caller`'s tenant owns it; JobNotFound otherwise (no leak)."""
    if len(job_id) > 64 or runtime.jobs.tenant(job_id) != caller.tenant:
        raise JobNotFound(job_id)
    return runtime.jobs.progress(job_id)


def cancel(
    runtime: Runtime, job_id: str, *, reason: str = "cancelled by the client"
) -> JobProgress:
    """Cancel a queued or running job (DELETE /v1/jobs/{id}, an MCP call given up, `webctx
    cancel`, Ctrl-C on `webctx research`): every task of it checks the job first and then
    returns, so no further search, fetch or embed runs and no bundle is made. A finished
    job is left as it is. Its progress after."""
    if not runtime.jobs.progress(job_id).finished:
        runtime.jobs.set_status(job_id, JobStatus.CANCELLED, error=reason)
        logger.info("job cancelled", extra={"job_id": job_id, "reason": reason})
    return runtime.jobs.progress(job_id)


def submit(
    runtime: Runtime, caller: Caller, request: JobRequest, *, idempotency_key: str | None = None
) -> tuple[str, bool]:
    """Start a job for the caller; (job id, True if new). Same idempotency key, same job.
    With no broker, the local service runs it with this runtime's settings (restarted with
    them when idle; SettingsMismatch when busy with others: webctx.workers.service_settings)."""
    from webctx.workers.service_settings import work_on_service

    check_request_limits(request, runtime.settings)
    with work_on_service(runtime.settings):
        return _submit(runtime, caller, request, idempotency_key)


def _submit(
    runtime: Runtime, caller: Caller, request: JobRequest, idempotency_key: str | None
) -> tuple[str, bool]:
    from webctx.workers.pipeline import submit_job

    job_id = uuid.uuid4().hex
    limit = runtime.settings.tenant_max_stored_bytes
    # Before the key is claimed: a refused job must not leave a key naming no job.
    runtime.jobs.stored.check(caller.tenant, len(request.model_dump_json().encode()), limit=limit)
    if idempotency_key is not None:
        if not 1 <= len(idempotency_key) <= 255:
            raise InvalidRequest("Idempotency-Key must be 1-255 characters")
        claimed = runtime.jobs.claim_idempotency_key(caller.tenant, idempotency_key, job_id)
        if claimed != job_id:
            _check_same_request(runtime, claimed, request)
            return claimed, False
    try:
        gate = runtime.jobs.admission
        slot = gate.admit(caller.tenant, job_id, admission_caps(runtime.settings))
        behind = runtime.settings.admission.queued_priority if slot is Slot.BEHIND else None
        try:
            submit_job(
                runtime.jobs,
                request,
                timeout_s=runtime.settings.job_timeout_s,
                job_id=job_id,
                tenant=caller.tenant,
                max_stored_bytes=limit,
                priority=behind,
                held=slot is Slot.HELD,
            )
            if slot is Slot.HELD:  # recorded: a freed slot may take it from now on
                gate.hold(caller.tenant, job_id)
        except Exception:  # not started (the quota, the broker): nothing holds its slot
            runtime.jobs.admission.release(caller.tenant, job_id)
            raise
    except (TooManyJobs, QuotaExceeded):  # QuotaExceeded: another took the last bytes
        if idempotency_key is not None:
            runtime.jobs.release_idempotency_key(caller.tenant, idempotency_key, job_id)
        raise
    logger.info("job submitted", extra={"job_id": job_id, "tenant": caller.tenant})
    return job_id, True


def _check_same_request(runtime: Runtime, job_id: str, request: JobRequest) -> None:
    try:
        previous = runtime.jobs.request(job_id)
    except JobNotFound:
        return  # the first caller is creating it this very moment
    if previous != request:
        raise Conflict(f"Idempotency-Key already used for job {job_id} with a different request")
