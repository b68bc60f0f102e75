"""Long calls the standard way: the MCP tasks extension (`io.modelcontextprotocol/tasks`,
SEP-2663, schema 2026-07-28).

A `tools/call` of a long tool (`web_context`) from a client that declared the extension in
that request's capabilities, on protocol 2026-07-28, is answered with a task handle
(`resultType: "task"`) as soon as its job is submitted and the task recorded; the client
polls `tasks/get`, which reports the job's progress as `statusMessage` and, once it has
finished, carries the tool's result inline: the same `CallToolResult` the call would have
returned (a failed job is a `completed` task whose result has `isError`). `tasks/cancel`
cancels the job the way `DELETE /v1/jobs/{id}` does. Nothing else changes for a client
without the extension, or on a 2025-11-25 `initialize` session (where the extension is
not defined): the call waits, bounded, and hands back a `get_job` handle.

A task is a record beside its job in the job store (webctx/jobs/task_records.py): it
outlives the MCP server, the API and the local service; each `tasks/*` request is checked
against its caller (the API key's tenant over HTTP), and another caller's task id is
answered as an unknown one (-32602).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolRequestParams,
    CallToolResult,
    RequestParams,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from webctx.api import runtime as runtimes
from webctx.api.mcp_jobs import caller_for, finished_result, progress_line
from webctx.api.runtime import Caller, Runtime
from webctx.errors import JobNotFound
from webctx.jobs.store import JobProgress
from webctx.jobs.task_records import TaskKind, TaskRecord
from webctx.models import JobStatus

TASKS = "io.modelcontextprotocol/tasks"
POLL_INTERVAL_MS = 1000
"""What `pollIntervalMs` suggests: a job's progress moves about once a second."""
_NEEDS_TASKS: dict[str, Any] = {"requiredCapabilities": {"extensions": {TASKS: {}}}}


class TaskParams(RequestParams):
    """`tasks/get` and `tasks/cancel`: the task."""

    task_id: str = Field(max_length=1000)


class TaskUpdateParams(TaskParams):
    """`tasks/update`: answers to a task's input requests (webctx's tasks never ask)."""

    input_responses: dict[str, Any] = Field(default_factory=dict)


def offers_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """True when this request may be answered with a task: protocol 2026-07-28 (the
    extension is not defined on a 2025-11-25 session) and the extension declared in this
    request's client capabilities."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS in capabilities.extensions)


@dataclass
class TaskStart:
    """A tool call that may become a task: the tool, once its job is submitted, records
    the task here (`begin`); the extension then answers with it instead of the result."""

    created: dict[str, Any] | None = field(default=None)

    def begin(self, runtime: Runtime, caller: Caller, *, kind: TaskKind, target: str,
              tool: str) -> None:  # fmt: skip
        """Record the task (durable once this returns) and its CreateTaskResult."""
        record = runtime.stores.tasks.create(tenant=caller.tenant, kind=kind, target=target,
                                             tool=tool)  # fmt: skip
        self.created = {"resultType": "task", **task_fields(record, "working", "submitted")}


_START: ContextVar[TaskStart | None] = ContextVar("webctx_mcp_task_start", default=None)


def task_start() -> TaskStart | None:
    """The task the running tool call may become, or None (answer it as a plain call)."""
    return _START.get()


def _stamp(seconds: float) -> str:
    moment = dt.datetime.fromtimestamp(seconds, dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_fields(record: TaskRecord, status: str, message: str, *, updated: float | None = None
          ) -> dict[str, Any]:  # fmt: skip
    return {"taskId": record.task_id, "status": status, "statusMessage": message,
            "createdAt": _stamp(record.created_at),
            "lastUpdatedAt": _stamp(updated or record.created_at),
            "ttlMs": record.ttl_s * 1000, "pollIntervalMs": POLL_INTERVAL_MS}  # fmt: skip


def _dump(result: CallToolResult) -> dict[str, Any]:
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


def job_task(runtime: Runtime, record: TaskRecord) -> dict[str, Any]:
    """The `tasks/get` view of a job's task: working with its progress, or its end."""
    try:
        progress = runtime.jobs.progress(record.target)
    except JobNotFound:
        message = "the job's state is gone (expired, or the state store lost it): call again"
        error = {"code": INTERNAL_ERROR, "message": message}
        return {**task_fields(record, "failed", message, updated=time.time()), "error": error}
    if not progress.finished:
        return task_fields(record, "working", progress_line(progress), updated=time.time())
    ended = runtime.jobs.finished_at(record.target) or time.time()
    if progress.status is JobStatus.CANCELLED:
        return task_fields(record, "cancelled", progress.error or "cancelled", updated=ended)
    result = _result(runtime, record.target, progress)
    message = _summary(result) if not result.is_error else "the job failed: see the result"
    return {**task_fields(record, "completed", message, updated=ended), "result": _dump(result)}


def _result(runtime: Runtime, job_id: str, progress: JobProgress) -> CallToolResult:
    try:
        return finished_result(runtime, job_id, progress)
    except ToolError as exc:  # the tool's error is a completed task's isError result
        return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)


def _summary(result: CallToolResult) -> str:
    out = result.structured_content or {}
    chunks, sources = len(out.get("chunks", [])), len(out.get("sources", []))
    return f"{chunks} passage{'s' * (chunks != 1)} from {sources} source{'s' * (sources != 1)}"


Views = dict[TaskKind, Callable[[Runtime, TaskRecord], dict[str, Any]]]


class TasksExtension(Extension):
    """The server's half of the tasks extension, for the tools named in `tools`."""

    identifier = TASKS

    def __init__(self, get_runtime: Callable[[], Runtime], *, tools: Sequence[str],
                 views: Views | None = None) -> None:  # fmt: skip
        self.get_runtime = get_runtime
        self.long_tools = frozenset(tools)
        self.views: Views = {"job": job_task, **(views or {})}

    def methods(self) -> Sequence[MethodBinding]:
        """tasks/get, tasks/cancel and tasks/update (tasks/result does not exist: -32601)."""
        return (
            MethodBinding("tasks/get", TaskParams, self._get),
            MethodBinding("tasks/cancel", TaskParams, self._cancel),
            MethodBinding("tasks/update", TaskUpdateParams, self._update),
        )

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:  # fmt: skip
        """Let a long tool's call become a task where this request allows one."""
        if params.name not in self.long_tools or not offers_tasks(ctx):
            return await call_next(ctx)
        start = TaskStart()
        token = _START.set(start)
        try:
            result = await call_next(ctx)
        finally:
            _START.reset(token)
        return start.created if start.created is not None else result

    def _record(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> TaskRecord:
        """The caller's task, or -32602 (unknown, expired, or another caller's)."""
        if not offers_tasks(ctx):
            raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY,
                           f"declare the {TASKS} extension in the request's client capabilities"
                           " (protocol 2026-07-28) to use tasks", data=_NEEDS_TASKS)  # fmt: skip
        runtime = self.get_runtime()
        # Before any read: a stopped (idle, killed) local service starts again, its state
        # store with it; a read first would meet the killed one's dead socket.
        runtime.keep_service()
        caller = caller_for(runtime, getattr(ctx.request, "headers", None))
        record = runtime.stores.tasks.get(task_id)
        if record is None or record.tenant != caller.tenant:
            raise MCPError(INVALID_PARAMS, f"no task {task_id!r}: unknown or expired")
        return record

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        def look() -> dict[str, Any]:
            record = self._record(ctx, params.task_id)
            return {"resultType": "complete", **self.views[record.kind](self.get_runtime(), record)}

        return await anyio.to_thread.run_sync(look)

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> HandlerResult:
        def stop() -> dict[str, Any]:
            record = self._record(ctx, params.task_id)
            runtime = self.get_runtime()
            if record.kind == "job":
                reason = "cancelled by the client (tasks/cancel)"
                runtimes.cancel(runtime, record.target, reason=reason)
            else:
                runtime.stores.batches.cancel(record.target)
            return {"resultType": "complete"}

        return await anyio.to_thread.run_sync(stop)

    async def _update(self, ctx: ServerRequestContext[Any, Any],
                      params: TaskUpdateParams) -> HandlerResult:  # fmt: skip
        # No webctx task asks for input: every response answers nothing outstanding, and
        # the spec says to ignore those and acknowledge.
        await anyio.to_thread.run_sync(self._record, ctx, params.task_id)
        return {"resultType": "complete"}
