"""What an MCP host sees of the server besides its tools: the capabilities it advertises
(no empty prompts; the tasks extension only where it is defined) and argument errors in
plain words.

The SDK advertises every feature it has a handler for: `prompts` although webctx has no
prompt, and the extensions in the `initialize` result too, though the tasks extension is
defined on protocol 2026-07-28 only (a 2025-11-25 client must not take it for that
session's own, different, experimental tasks). A tool's arguments that fail validation
come back from the SDK as pydantic's text, with a link to its documentation per error.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import METHOD_NOT_FOUND, CallToolResult, InputRequiredResult
from pydantic import ValidationError

from webctx.api.mcp_tasks import TASKS
from webctx.problems import plain_message

MODERN_ONLY = frozenset({TASKS})
"""Extensions defined on protocol 2026-07-28 only: not advertised to an `initialize`."""
UNSERVED = frozenset({"prompts/list", "prompts/get"})
"""Methods the SDK serves that webctx does not offer (it has no prompts)."""


class WebctxMCP(MCPServer[Any]):
    """MCPServer whose tools' argument errors read `invalid arguments: max_sources must be
    between 1 and 100 (got 500)`."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        """Call a tool; refused arguments are a ToolError in plain words."""
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ValidationError):
                raise
            tool = next((t for t in await self.list_tools() if t.name == name), None)
            schema = tool.input_schema if tool is not None else None
            raise ToolError(
                f"invalid arguments: {plain_message(cause.errors(), schema)}"
            ) from cause


class HostSurface:
    """Middleware: capabilities as webctx serves them, and no prompt methods."""

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method in UNSERVED:
            raise MCPError(METHOD_NOT_FOUND, "Method not found", data=ctx.method)
        result = await call_next(ctx)
        if ctx.method not in ("initialize", "server/discover") or not isinstance(result, dict):
            return result
        capabilities = dict(result.get("capabilities") or {})
        capabilities.pop("prompts", None)
        extensions = {k: v for k, v in (capabilities.pop("extensions", None) or {}).items()
                      if not (ctx.method == "initialize" and k in MODERN_ONLY)}  # fmt: skip
        if extensions:
            capabilities["extensions"] = extensions
        return {**result, "capabilities": capabilities}
