"""The tasks extension's client half on the official Python SDK's own seam (mcp 2.x has
no tasks runtime): a `ClientExtension` that declares `io.modelcontextprotocol/tasks` on
every request and claims `resultType: "task"`, resolving it by polling `tasks/get` at the
server's `pollIntervalMs` until the task ends. `Client(..., extensions=[TasksClient()])`
then returns a task's final `CallToolResult` from `call_tool`, as the SEP's backward
compatibility note describes; `seen` keeps every `tasks/get` answer."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import anyio
import mcp_types as types
from mcp.client import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, TypeAdapter

TASKS = "io.modelcontextprotocol/tasks"
_ANY = TypeAdapter(dict[str, Any])


class CreatedTask(types.Result):
    """A CreateTaskResult (schema 2026-07-28)."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class TaskRequest(types.Request[dict[str, Any], str]):
    """`tasks/get` or `tasks/cancel`; over HTTP the task id goes in `Mcp-Name` too."""

    name_param: ClassVar[str | None] = "taskId"


class TasksClient(ClientExtension):
    """Declares the tasks extension and turns a task into its final tool result."""

    identifier = TASKS

    def __init__(self) -> None:
        self.created: list[CreatedTask] = []
        self.seen: list[dict[str, Any]] = []

    def claims(self) -> list[ResultClaim[Any]]:
        """The one claim: `resultType: "task"` on `tools/call`."""
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self._resolve)]

    async def _resolve(self, created: CreatedTask, ctx: ClaimContext) -> types.CallToolResult:
        self.created.append(created)
        interval = (created.poll_interval_ms or 1000) / 1000
        while True:
            await anyio.sleep(interval)
            request = TaskRequest(method="tasks/get", params={"taskId": created.task_id})
            task = await ctx.session.send_request(request, _ANY)
            self.seen.append(task)
            interval = task.get("pollIntervalMs", 1000) / 1000
            if task["status"] == "completed":
                return types.CallToolResult.model_validate(task["result"])
            if task["status"] == "failed":
                error = task["error"]
                raise MCPError(error["code"], error["message"], error.get("data"))
            if task["status"] == "cancelled":
                raise MCPError(-32800, f"task {created.task_id} cancelled")
