"""What an MCP tool call sees of a research job: its caller, progress notifications while
it waits, the running job's handle when the wait ends first, and the finished job as a
tool result (the same for a plain call, `get_job` and a task's `tasks/get`)."""

from __future__ import annotations

from collections.abc import Mapping

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations

from webctx.api.deps import wait_for_finish
from webctx.api.runtime import Caller, Runtime, cancel
from webctx.jobs.store import JobProgress
from webctx.models import Bundle, JobRequest, JobStatus
from webctx.stages.bundle import render_markdown

# Every tool only reads (a research job writes nothing the caller can see change), asks
# the open web, and answers the same call the same way (caches, idempotent job steps).
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=True, idempotent_hint=True)

# The TypeScript SDK, and so Claude Code, Cursor and the Inspector, times a request out
# after 60 s by default and then cancels it; a call waits less and hands back the job.
WAIT_LIMIT_S = 600.0


class WebContextOut(Bundle):
    """The bundle of a finished job, or (no passages yet) the job a caller polls."""

    status: JobStatus = JobStatus.SUCCEEDED


def caller_for(runtime: Runtime, headers: Mapping[str, str] | None) -> Caller:
    """Over HTTP the key's tenant (the guard checked it); over stdio the local tenant."""
    if headers is None or not runtime.auth_required:
        return Caller(tenant=runtime.settings.local_tenant)
    _, _, token = (headers.get("authorization") or "").partition(" ")
    record = runtime.tenants.resolve(token.strip())
    if record is None:
        raise ToolError("invalid or revoked API key")
    return Caller(tenant=record.tenant, key_id=record.key_id)


def progress_line(p: JobProgress) -> str:
    """What the job has done so far, in one line: `running: searched 2/2 queries, fetched
    5/8 pages (1 failed), embedded 4`."""
    if p.status is JobStatus.QUEUED:
        return "queued: waiting for a worker"
    return (
        f"{p.status.value}: searched {p.searched}/{p.queries} queries, fetched"
        f" {p.fetched}/{p.urls} pages ({p.failed} failed), embedded {p.embedded}"
    )


class _Reporter:
    """Turns progress snapshots into MCP progress notifications, each value once, rising.

    Snapshots change more often than the count shown: a status change (queued to
    running), the number of URLs becoming known, or a counter the count leaves out. Each
    of those used to repeat the last value; the spec wants every value to increase."""

    def __init__(self, ctx: Context, request: JobRequest) -> None:
        self.ctx = ctx
        self.request = request
        self.sent: float | None = None

    async def __call__(self, p: JobProgress) -> None:
        urls = p.urls or self.request.max_sources
        total = float(max(p.queries, 1) + 2 * urls + 1)
        done = p.searched + p.fetched + p.failed + p.embedded
        value = total if p.finished else min(float(done), total - 1)
        if self.sent is not None and value <= self.sent:
            return
        self.sent = value
        await self.ctx.report_progress(value, total, progress_line(p))


def pending_result(
    job_id: str, request: JobRequest, p: JobProgress, wait_s: float
) -> CallToolResult:
    """The job still running after the call's wait: its id and what it has done."""
    out = WebContextOut(job_id=job_id, question=request.question, queries=[], sources=[],
                        chunks=[], status=p.status)  # fmt: skip
    text = (
        f"Job {job_id} is still {p.status.value} after {wait_s:g} s: searched"
        f" {p.searched}/{p.queries}, fetched {p.fetched}/{p.urls} ({p.failed} failed),"
        f" embedded {p.embedded}. It goes on; no passages yet. Call get_job with"
        f' job_id="{job_id}" to wait for its bundle.'
    )
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=out.model_dump(mode="json"),
    )


def finished_result(runtime: Runtime, job_id: str, progress: JobProgress) -> CallToolResult:
    """A finished job as a tool result: its bundle, or ToolError saying why there is none."""
    bundle = runtime.jobs.bundle(job_id)
    if progress.status is not JobStatus.SUCCEEDED or bundle is None:
        raise ToolError(f"job {job_id} {progress.status.value}: {progress.error or 'no bundle'}")
    return CallToolResult(
        content=[TextContent(type="text", text=render_markdown(bundle))],
        structured_content=WebContextOut(**bundle.model_dump()).model_dump(mode="json"),
    )


async def await_bundle(
    ctx: Context, runtime: Runtime, job_id: str, *, wait_s: float, cancel_job_too: bool
) -> CallToolResult:
    """Wait up to `wait_s` with progress: the bundle, the job still running, or a tool error.

    `cancel_job_too`: a client that cancels the call cancels the job too (web_context)."""
    request = await anyio.to_thread.run_sync(runtime.jobs.request, job_id)
    wait_s = min(wait_s, runtime.settings.api_context_timeout_s)
    try:
        progress = await wait_for_finish(
            runtime, job_id, timeout_s=wait_s, on_progress=_Reporter(ctx, request)
        )
    except anyio.get_cancelled_exc_class():
        if cancel_job_too:
            with anyio.CancelScope(shield=True):  # the client gave up: stop the job's work
                await anyio.to_thread.run_sync(
                    lambda: cancel(runtime, job_id, reason="cancelled: the MCP call was given up")
                )
        raise
    if not progress.finished:
        return pending_result(job_id, request, progress, wait_s)
    return await anyio.to_thread.run_sync(finished_result, runtime, job_id, progress)
