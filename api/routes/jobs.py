"""`/v1/jobs`: submit, status, progress events (SSE), bundle, cancel."""

from __future__ import annotations

from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Path, Query, Response, status
from fastapi.responses import PlainTextResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel, ConfigDict, Field

from webctx.api.deps import CallerDep, RuntimeDep
from webctx.api.runtime import Runtime, cancel, owned_progress, submit
from webctx.errors import Conflict, JobNotFound
from webctx.jobs.fanin import failure_bundle
from webctx.jobs.store import JobProgress
from webctx.models import Bundle, JobRequest, JobStatus

router = APIRouter(prefix="/v1", tags=["jobs"])
JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="A job id.")]


class OutputFormat(StrEnum):
    """How a bundle is returned."""

    json = "json"
    markdown = "markdown"


class ErrorOut(BaseModel):
    """Every error response: a stable code and a message meant for people."""

    error: str = Field(description="Machine-readable code, e.g. not_found, invalid_request.")
    message: str
    detail: list[dict[str, Any]] | None = None


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 403, 404, 409, 413, 422, 429)
}
ERRORS[429]["description"] = (
    "rate_limited (the key's requests per minute) or too_many_jobs (the tenant's unfinished "
    "jobs fill WEBCTX_ADMISSION__RUNNING plus WEBCTX_ADMISSION__QUEUED)"
)
RETRY_AFTER = {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
ERRORS[429]["headers"] = {"Retry-After": RETRY_AFTER}
# The events route streams text/event-stream, but its errors are JSON like the others'.
JSON_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {
        "description": "Error",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}},
    }
    for code in ERRORS
}


class JobSubmit(JobRequest):
    """A research job: the question and its knobs, plus the preferred bundle format."""

    model_config = ConfigDict(extra="forbid")
    format: OutputFormat = Field(
        default=OutputFormat.json, description="Format the returned bundle URL asks for."
    )

    def to_request(self) -> JobRequest:
        """The pipeline's request (without API-only fields)."""
        return JobRequest.model_validate(self.model_dump(exclude={"format"}))


class ProgressOut(BaseModel):
    """Per-stage counts so far."""

    queries: int
    searched: int
    urls: int
    fetched: int
    failed: int
    embedded: int
    chunks: int
    tokens_embedded: int


class JobLinks(BaseModel):
    """Where to follow a job."""

    status: str
    events: str
    bundle: str


class JobOut(BaseModel):
    """A job's state, progress and links."""

    job_id: str
    status: JobStatus
    error: str | None = None
    reason: str | None = Field(
        default=None,
        description="Why the job failed as a whole, not because of its pages: provider_down "
        "(a search or embeddings provider it needs is down; `error` names it, its URL and the "
        "fix).",
    )
    progress: ProgressOut
    links: JobLinks


def job_out(progress: JobProgress, *, fmt: OutputFormat = OutputFormat.json) -> JobOut:
    """The public view of a progress snapshot."""
    base = f"/v1/jobs/{progress.job_id}"
    query = "?format=markdown" if fmt is OutputFormat.markdown else ""
    return JobOut(
        job_id=progress.job_id,
        status=progress.status,
        error=progress.error,
        reason=progress.reason,
        progress=ProgressOut(
            queries=progress.queries,
            searched=progress.searched,
            urls=progress.urls,
            fetched=progress.fetched,
            failed=progress.failed,
            embedded=progress.embedded,
            chunks=progress.counters.get("chunks", 0),
            tokens_embedded=progress.counters.get("tokens_embedded", 0),
        ),
        links=JobLinks(status=base, events=f"{base}/events", bundle=f"{base}/bundle{query}"),
    )


def owned_job(job_id: JobId, caller: CallerDep, runtime: RuntimeDep) -> JobProgress:
    """Dependency: the caller's job, or 404."""
    return owned_progress(runtime, caller, job_id)


OwnedJob = Annotated[JobProgress, Depends(owned_job)]


@router.post("/jobs", status_code=status.HTTP_202_ACCEPTED, responses=ERRORS)
def create_job(
    body: JobSubmit,
    response: Response,
    caller: CallerDep,
    runtime: RuntimeDep,
    idempotency_key: Annotated[
        str | None,
        Header(max_length=255, description="Same key (per tenant), same job: safe retries."),
    ] = None,
) -> JobOut:
    """Submit a research job; returns at once with its id and where to follow it."""
    job_id, created = submit(runtime, caller, body.to_request(), idempotency_key=idempotency_key)
    try:
        progress = runtime.jobs.progress(job_id)
    except JobNotFound:  # a concurrent first caller with the same key is still creating it
        progress = JobProgress(job_id=job_id, status=JobStatus.QUEUED)
    out = job_out(progress, fmt=body.format)
    response.headers["Location"] = out.links.status
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return out


@router.get("/jobs/{job_id}", responses=ERRORS)
def read_job(job: OwnedJob) -> JobOut:
    """A job's status (queued, running, succeeded, failed, cancelled) and stage counts."""
    return job_out(job)


@router.get("/jobs/{job_id}/events", response_class=EventSourceResponse, responses=JSON_ERRORS)
async def job_events(job: OwnedJob, runtime: RuntimeDep) -> AsyncIterator[ServerSentEvent]:
    """The job's progress as Server-Sent Events: `progress` on each change, then `end`."""
    last: JobOut | None = None
    seq = 0
    progress = job
    while True:
        current = job_out(progress)
        if current != last:
            seq += 1
            kind = "end" if progress.finished else "progress"
            yield ServerSentEvent(event=kind, id=str(seq), data=current.model_dump(mode="json"))
            last = current
        if progress.finished:
            return
        await anyio.sleep(0.25)
        progress = await anyio.to_thread.run_sync(runtime.jobs.progress, job.job_id)


@router.get(
    "/jobs/{job_id}/bundle",
    responses={
        **ERRORS,
        200: {
            "content": {"text/markdown": {"schema": {"type": "string"}}},
            "description": "The bundle as JSON, or Markdown with ?format=markdown.",
        },
    },
)
def read_bundle(
    job: OwnedJob,
    runtime: RuntimeDep,
    format: Annotated[OutputFormat, Query()] = OutputFormat.json,
) -> Bundle:
    """The job's cited bundle (also for a failed job: it lists the failures); 409 before."""
    found = finished_bundle(runtime, job)
    if found is None:
        raise Conflict(f"job {job.job_id} is {job.status.value}: it has no bundle yet")
    if format is OutputFormat.markdown:
        return markdown_response(found)  # type: ignore[return-value]
    return found


def finished_bundle(runtime: Runtime, job: JobProgress) -> Bundle | None:
    """The job's bundle; a failed job that stored none gets one listing its failures."""
    found = runtime.jobs.bundle(job.job_id)
    if found is None and job.status is JobStatus.FAILED:
        return failure_bundle(runtime.jobs, job.job_id)
    return found


def markdown_response(bundle: Bundle) -> PlainTextResponse:
    """A bundle rendered as Markdown."""
    from webctx.stages.bundle import render_markdown

    return PlainTextResponse(render_markdown(bundle), media_type="text/markdown")


@router.delete("/jobs/{job_id}", responses=ERRORS)
def cancel_job(job: OwnedJob, runtime: RuntimeDep) -> JobOut:
    """Cancel a queued or running job: its pending tasks do nothing from now on.

    A finished job is left as it is (and returned as it is).
    """
    return job_out(cancel(runtime, job.job_id))
